"""Namespaces and object addresses.

Every address the product compares is a key relative to the storage namespace. These
pure functions decide what is inside a namespace; they err towards "outside" (never
collected) and towards keeping more spellings of a live key, never fewer.
"""

from __future__ import annotations

import functools
import os
import posixpath
import re
import unicodedata
from typing import Optional
from urllib.parse import unquote, urlsplit

SCHEME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
S3_SCHEMES = ("s3", "s3a", "s3n")
GCS_SCHEMES = ("gs", "gcs")
# Azure Blob and ADLS Gen2: `container@account.<dfs|blob>.<suffix>`; az:// names only the container.
AZURE_SCHEMES = ("abfss", "abfs", "wasbs", "wasb", "az")
AZURE_HOST = re.compile(r"^(?P<account>[A-Za-z0-9]+)\.(?:dfs|blob)\.(?P<suffix>[A-Za-z0-9.-]+)$")
UNSUPPORTED = "unsupported scheme (use file:///path, s3://bucket/prefix, gs://bucket/prefix or abfss://container@account.dfs.core.windows.net/prefix)"


def normalize_namespace(uri: str) -> str:
    """Canonical `file:///abs/path`, `s3://bucket/prefix`, `gs://bucket/prefix` or
    `abfss://container@account.dfs.<suffix>/prefix`, without a trailing slash.

    A bare path is taken literally, a `file:` URI's path percent-decoded; a local path holding
    '%', '?' or '#' is refused: normalized again, its normal form would name another directory.
    """
    if not uri or not uri.strip():
        raise ValueError("storage namespace is empty")
    uri = uri.strip()
    if uri.startswith("/") or uri[:5].lower() == "file:":
        path = _file_path(uri)
        if path is None:
            raise ValueError(f"{uri!r}: file URIs must be file:///absolute/path")
        path = posixpath.normpath(path if uri.startswith("/") else unquote(path))
        if path == "/":
            raise ValueError(f"{uri!r}: a file namespace must be an absolute directory other than /")
        if any(char in path for char in "%?#"):
            raise ValueError(f"{uri!r}: a file namespace's path may not hold '%', '?' or '#'")
        return "file://" + path
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme in S3_SCHEMES:
        if not parts.netloc:
            raise ValueError(f"{uri!r}: an S3 namespace needs a bucket")
        prefix = parts.path.strip("/")
        return f"s3://{parts.netloc}" + (f"/{prefix}" if prefix else "")
    if scheme in GCS_SCHEMES:
        if not parts.netloc:
            raise ValueError(f"{uri!r}: a GCS namespace needs a bucket")
        prefix = parts.path.strip("/")
        return f"gs://{parts.netloc}" + (f"/{prefix}" if prefix else "")
    if scheme == "az":
        raise ValueError(
            f"{uri!r}: an Azure namespace names its account: abfss://container@account.dfs.core.windows.net/prefix"
        )
    if scheme in AZURE_SCHEMES:
        prefix = parts.path.strip("/")
        return azure_root(*_azure_location(uri, parts.netloc)) + (f"/{prefix}" if prefix else "")
    raise ValueError(f"{uri!r}: {UNSUPPORTED}")


def _file_path(uri: str) -> Optional[str]:
    """The path of a bare absolute path or `file:` URI; None when it names another host or no
    absolute path. All after the authority is path, as in Hadoop's Path: a file named `a#b` is
    that file, and no character is dropped (urlsplit cuts at '?' and '#' and drops tabs)."""
    if uri.startswith("/"):
        return uri
    authority, rest = "", uri[len("file:") :]
    if rest.startswith("//"):
        authority, slash, tail = rest[2:].partition("/")
        rest = slash + tail
    return rest if authority in ("", "localhost") and rest.startswith("/") else None


def _azure_location(uri: str, netloc: str) -> tuple[str, str, str]:
    """(container, account, endpoint suffix) of an abfss, abfs, wasbs or wasb URI's authority."""
    container, at, host = netloc.partition("@")
    match = AZURE_HOST.match(host)
    if not at or not container or match is None:
        raise ValueError(f"{uri!r}: an Azure URI is abfss://container@account.dfs.<suffix>/path")
    return container, match.group("account"), match.group("suffix")


def azure_root(container: str, account: str, suffix: str) -> str:
    """The one spelling of an Azure container: abfss, the dfs host, every part lower-cased."""
    return f"abfss://{container.lower()}@{account.lower()}.dfs.{suffix.lower()}"


def azure_parts(namespace: str) -> tuple[str, str, str, str]:
    """(container, account, endpoint suffix, key prefix) of a normalized Azure namespace."""
    parts = urlsplit(namespace)
    return (*_azure_location(namespace, parts.netloc), parts.path.strip("/"))


def real_namespace(namespace: str) -> str:
    """A normalized namespace with `file:` resolved through symlinks: the directory storage really holds."""
    namespace = normalize_namespace(namespace)
    if namespace.startswith("file://"):
        return "file://" + real_path(local_path(namespace))
    scheme, _, rest = namespace.partition("://")
    bucket, _, prefix = rest.partition("/")
    return f"{scheme}://{bucket.lower()}" + (f"/{prefix}" if prefix else "")


def namespace_contains(outer: str, inner: str) -> Optional[str]:
    """The key of `inner` inside `outer` ('' when they are the same place), or None when disjoint.

    Both are compared as real locations, so a symlink or an `s3a://` spelling of one
    namespace is the same namespace.
    """
    outer_real, inner_real = real_namespace(outer), real_namespace(inner)
    if outer_real == inner_real:
        return ""
    if inner_real.startswith(outer_real + "/"):
        return inner_real[len(outer_real) + 1 :]
    return None


def canonical_address(address: str, namespace: Optional[str] = None) -> str:
    """One spelling per absolute address: `s3a`/`s3n` as `s3` and `gcs` as `gs` with the bucket
    lower-cased, every Azure spelling of a container as `abfss://container@account.dfs.<suffix>`
    (an `az://container/...` address takes its account from an Azure `namespace`, and stays
    `az://` without one), and `file:` URIs (or bare absolute paths) as `file://` plus the
    real path, symlinks resolved.

    Relative addresses are returned unchanged: they are keys relative to the namespace.
    """
    if not is_absolute_uri(address):
        return address
    scheme = "file" if address.startswith("/") else address.partition(":")[0].lower()
    if scheme == "file":
        # Percent-escapes stay as written: key_spellings() protects the decoded spelling too.
        path = _file_path(address)
        return lower_scheme(address) if path is None else "file://" + real_path(path)
    if scheme in S3_SCHEMES:
        bucket, _, key = address.split(":", 1)[1].lstrip("/").partition("/")
        return f"s3://{bucket.lower()}/{key}"
    if scheme in GCS_SCHEMES:
        bucket, _, key = address.split(":", 1)[1].lstrip("/").partition("/")
        return f"gs://{bucket.lower()}/{key}"
    if scheme in AZURE_SCHEMES:
        return _canonical_azure(address, scheme, namespace)
    return lower_scheme(address)


def _canonical_azure(address: str, scheme: str, namespace: Optional[str]) -> str:
    authority, _, key = address.split(":", 1)[1][2:].partition("/")
    if scheme != "az":
        try:
            return azure_root(*_azure_location(address, authority)) + "/" + key
        except ValueError:
            return lower_scheme(address)  # names no Azure object: outside every namespace
    if not authority or "@" in authority:
        return lower_scheme(address)  # az:// URIs are az://container/path
    if namespace is None or not namespace.startswith("abfss://"):
        return f"az://{authority.lower()}/{key}"
    _, account, suffix, _ = azure_parts(namespace)
    return azure_root(authority, account, suffix) + "/" + key


def real_path(path: str) -> str:
    """`path` with every symlink resolved; its directory's resolution is cached (many files share one)."""
    directory, name = os.path.split(path)
    resolved = os.path.join(_real_directory(directory), name)
    return os.path.realpath(resolved) if os.path.islink(resolved) or name in ("", ".", "..") else resolved


@functools.lru_cache(maxsize=65536)
def _real_directory(directory: str) -> str:
    return os.path.realpath(directory)


def classify_address(address: str, namespace: str) -> Optional[str]:
    """The key of `address` inside `namespace`, or None when it lies outside (docs/design.md §10).

    Relative addresses are keys already. Absolute ones are compared in their canonical
    spelling with the namespace's real location, so an alias of the namespace (a
    symlink, `s3a://`) is recognized as inside.
    """
    if not is_absolute_uri(address):
        return address
    canonical = canonical_address(address, normalize_namespace(namespace))
    root = real_namespace(namespace) + "/"
    if canonical.startswith(root) and len(canonical) > len(root):
        return canonical[len(root) :]
    return None


def under_external_prefix(address: str, external_prefixes: tuple[str, ...] | list[str]) -> bool:
    """Whether an absolute address lies under one of the configured external prefixes."""
    canonical = canonical_address(address)
    return any(canonical.startswith(real_namespace(prefix) + "/") for prefix in external_prefixes)


def is_absolute_uri(address: str) -> bool:
    return bool(SCHEME_PATTERN.match(address)) or address.startswith("/")


def local_path(namespace: str) -> str:
    """Filesystem path of a `file://` namespace."""
    if not namespace.startswith("file://"):
        raise ValueError(f"{namespace!r} is not a local namespace")
    return namespace[len("file://") :]


def namespace_uri_prefixes(namespace: str) -> list[str]:
    """Every spelling of `namespace + '/'` an absolute address may start with (scheme lower-cased)."""
    if namespace.startswith("file://"):
        path = local_path(namespace)
        return [f"file://{path}/", f"file:{path}/", f"file://localhost{path}/", f"{path}/"]
    if namespace.startswith("abfss://"):
        container, account, suffix, prefix = azure_parts(namespace)
        tail = f"/{prefix}/" if prefix else "/"
        return [
            *(f"{scheme}://{container}@{account}.dfs.{suffix}{tail}" for scheme in ("abfss", "abfs")),
            *(f"{scheme}://{container}@{account}.blob.{suffix}{tail}" for scheme in ("wasbs", "wasb")),
            f"az://{container}{tail}",
        ]
    scheme, rest = namespace.split("://", 1)
    return [f"{s}://{rest}/" for s in (GCS_SCHEMES if scheme == "gs" else S3_SCHEMES)]


def lower_scheme(address: str) -> str:
    match = SCHEME_PATTERN.match(address)
    return address if not match else match.group(0).lower() + address[match.end() :]


def key_spellings(key: str) -> list[str]:
    """Every spelling under which storage might hold the object a live key names.

    Storage compares keys literally (S3) or after path resolution (a filesystem), and
    writers differ in percent-encoding and Unicode normalization, so a live key also
    protects its resolved (`data/./x` -> `data/x`), percent-decoded and NFC/NFD
    spellings. A spelling that escapes the namespace is dropped: it names nothing inside.
    """
    variants = [key, unquote(key)] if "%" in key else [key]
    variants += [unicodedata.normalize(form, v) for v in list(variants) for form in ("NFC", "NFD") if not v.isascii()]
    spellings: list[str] = []
    for variant in variants:
        for spelling in (variant, posixpath.normpath(variant) if variant else variant):
            if spelling not in spellings and (spelling == key or not escapes(spelling)):
                spellings.append(spelling)
    return spellings


def escapes(key: str) -> bool:
    """Whether a relative key, its path resolved, names nothing inside the namespace."""
    resolved = posixpath.normpath(key) if key else key
    return resolved in (".", "", "..") or resolved.startswith(("../", "/"))


def is_plain_key(key: str) -> bool:
    """A key storage may be asked to act on: relative, without '.', '..' or empty segments, no NUL."""
    if not key or is_absolute_uri(key) or "\x00" in key:
        return False
    return all(part not in ("", ".", "..") for part in key.split("/"))


def under_prefix(key: str, prefixes: tuple[str, ...] | list[str]) -> bool:
    """True when `key` is one of `prefixes` or lies below one (a prefix ends at '/')."""
    for prefix in prefixes:
        bare = prefix.rstrip("/")
        if key == bare or key.startswith(bare + "/"):
            return True
    return False
