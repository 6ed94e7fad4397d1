"""Server-rendered pages (htmx), one module per area. Views parse, call one service,
and render; the services decide."""
