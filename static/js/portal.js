// The portal's only script of its own, served as a static file: the
// Content-Security-Policy allows no inline script, handler or javascript: URL.
"use strict";

// <a data-back href="..."> goes back in history when there is one, else follows its href.
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-back]");
  if (link && window.history.length > 1) {
    event.preventDefault();
    window.history.back();
  }
});
