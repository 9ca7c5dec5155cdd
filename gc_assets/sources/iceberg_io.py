"""pyiceberg's pyarrow FileIO, with Azure locations addressed the way pyarrow's AzureFileSystem
expects them. Loaded by pyiceberg from the `py-io-impl` property, so only when a table is read."""

from __future__ import annotations

from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import EMPTY_DICT, Properties

AZURE_SCHEMES = frozenset({"abfs", "abfss", "wasb", "wasbs"})


class BlobFileIO(PyArrowFileIO):
    """pyiceberg 0.12 hands `container@account.dfs.core.windows.net/path` to AzureFileSystem,
    which reads the whole netloc as a container name: no Azure table could be opened. The
    filesystem already knows the account, so the path it needs is `container/path`."""

    @staticmethod
    def parse_location(location: str, properties: Properties = EMPTY_DICT) -> tuple[str, str, str]:
        scheme, netloc, path = PyArrowFileIO.parse_location(location, properties)
        if scheme in AZURE_SCHEMES and "@" in netloc:
            return scheme, netloc, netloc.split("@", 1)[0] + path[len(netloc) :]
        return scheme, netloc, path
