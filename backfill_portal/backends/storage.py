"""Where an Iceberg warehouse's files are: a local directory, or a bucket of an object
store (`s3://bucket/prefix`), both reached through pyarrow's filesystems, the ones
pyiceberg's own FileIO uses, so the portal's files and the catalog's metadata are
written by one client with one configuration.

A *location* is what the backend keeps and passes around: an absolute local path, or a
URI (`s3://bucket/key`). `uri` is how Iceberg is told a location (`file://` added for a
local one); `engine_path` how DuckDB is (a local path as is; an object's URI, which the
DuckDB connection reads through `fsspec()`, registered on it: no httpfs extension, which
DuckDB would download at run time).

What differs between the two is said where it differs: a local write is fsynced and a
marker renamed into place; an object is one PUT, whole or absent. Directories exist only
locally; an object store has keys.
"""
from __future__ import annotations

import os
import posixpath
import uuid
from typing import Any
from urllib.parse import urlparse

from backfill_portal.backends.base import WarehouseUnavailable
from backfill_portal.core.errors import ValidationError

#: The object stores a warehouse location may name (pyarrow's S3 client; tested against
#: an S3 API server in tests/backends).
OBJECT_SCHEMES = ("s3",)


class Storage:
    """The files under one warehouse root, local or in an object store."""

    def __init__(self, root: str, properties: dict[str, str] | None = None):
        self.properties = dict(properties or {})
        if "://" in root and not root.startswith("file://"):
            scheme = urlparse(root).scheme
            if scheme not in OBJECT_SCHEMES:
                raise ValidationError(
                    f"WAREHOUSE_URL: warehouse={root} is not a local path or an object store this backend "
                    f"reaches ({', '.join(s + '://' for s in OBJECT_SCHEMES)})", field="WAREHOUSE_URL")
            if not urlparse(root).netloc:
                raise ValidationError(f"WAREHOUSE_URL: warehouse={root} names no bucket", field="WAREHOUSE_URL")
            self.scheme = scheme
            self.root = root.rstrip("/")
        else:
            self.scheme = "file"
            self.root = os.path.abspath(root.removeprefix("file://"))
        self._fs = None

    @property
    def local(self) -> bool:
        return self.scheme == "file"

    # -- names ----------------------------------------------------------------------------

    @staticmethod
    def join(location: str, *parts: str) -> str:
        return posixpath.join(location, *parts)

    @staticmethod
    def name(location: str) -> str:
        return posixpath.basename(location.rstrip("/"))

    def uri(self, location: str) -> str:
        """The location as Iceberg metadata names it."""
        return f"file://{location}" if self.local else location

    def engine_path(self, uri: str) -> str:
        """A file Iceberg names, as the DuckDB connection opens it."""
        return uri.removeprefix("file://") if self.local else uri

    def _path(self, location: str) -> str:
        """The location as the pyarrow filesystem names it (no scheme)."""
        return location if self.local else location.split("://", 1)[1]

    def _location(self, path: str) -> str:
        return path if self.local else f"{self.scheme}://{path}"

    # -- the clients --------------------------------------------------------------------

    @property
    def fs(self):
        """The pyarrow filesystem, as pyiceberg's FileIO builds it from the same properties."""
        if self._fs is None:
            if self.local:
                from pyarrow.fs import LocalFileSystem

                self._fs = LocalFileSystem()
            else:
                from pyiceberg.io.pyarrow import PyArrowFileIO

                self._fs = PyArrowFileIO(self.properties).fs_by_scheme(self.scheme, urlparse(self.root).netloc)
        return self._fs

    def fsspec(self) -> Any:
        """The object store as an fsspec filesystem for DuckDB's `register_filesystem`,
        or None for a local warehouse (DuckDB reads local files itself)."""
        if self.local:
            return None
        from fsspec.implementations.arrow import ArrowFSWrapper

        class ObjectStore(ArrowFSWrapper):
            protocol = self.scheme

        return ObjectStore(self.fs)

    def probe(self) -> None:
        """The root is reachable (the bucket exists and answers), or WarehouseUnavailable."""
        if self.local:
            return
        from pyarrow.fs import FileType

        bucket = urlparse(self.root).netloc
        try:
            found = self.fs.get_file_info(bucket).type
        except OSError as exc:
            raise WarehouseUnavailable(f"warehouse {self.root}: {exc}") from exc
        if found == FileType.NotFound:
            raise WarehouseUnavailable(f"warehouse {self.root}: bucket {bucket!r} does not exist")

    # -- files ------------------------------------------------------------------------------

    def make_dir(self, location: str) -> None:
        if self.local:
            os.makedirs(location, exist_ok=True)

    def remove_dir(self, location: str) -> None:
        """Remove an empty local directory (nothing to do on an object store)."""
        if self.local:
            try:
                os.rmdir(location)
            except OSError:
                pass

    def files(self, location: str, *, recursive: bool = False) -> list[str]:
        """The files under a directory (every level with `recursive`), as locations, sorted;
        none if it does not exist."""
        from pyarrow.fs import FileSelector, FileType

        infos = self.fs.get_file_info(FileSelector(self._path(location), recursive=recursive, allow_not_found=True))
        return sorted(self._location(i.path) for i in infos if i.type == FileType.File)

    def exists(self, location: str) -> bool:
        from pyarrow.fs import FileType

        return self.fs.get_file_info(self._path(location)).type == FileType.File

    def read_text(self, location: str) -> str | None:
        try:
            with self.fs.open_input_stream(self._path(location)) as stream:
                return stream.read().decode()
        except FileNotFoundError:
            return None

    def delete(self, location: str) -> None:
        try:
            self.fs.delete_file(self._path(location))
        except FileNotFoundError:
            pass

    def write_parquet(self, location: str, table) -> None:
        """A Parquet file, durable when this returns (local: fsynced)."""
        import pyarrow.parquet as pq

        if self.local:
            with open(location, "wb") as out:
                pq.write_table(table, out, compression="zstd")
                out.flush()
                os.fsync(out.fileno())
            return
        with self.fs.open_output_stream(self._path(location)) as out:
            pq.write_table(table, out, compression="zstd")

    def write_whole(self, location: str, text: str) -> None:
        """A small file that readers see whole or not at all: locally written aside,
        fsynced and renamed into place; on an object store one PUT (an object appears
        when its upload completes)."""
        if self.local:
            staging = self.join(posixpath.dirname(location), f".{self.name(location)}.{uuid.uuid4().hex}")
            with open(staging, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(staging, location)
            return
        with self.fs.open_output_stream(self._path(location)) as out:
            out.write(text.encode())
