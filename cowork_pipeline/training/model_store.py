"""Model folders of an object-store lake, kept in the store beside its tables (``<lake>/models/<checkpoint id>``).

A step that trains writes its checkpoint to a local folder, then :func:`upload` copies it to the store; a step
elsewhere (another pod, another host) that loads it calls :func:`fetch`, which downloads it into a local folder once
and reuses it while the store holds the same files. What makes a store folder whole is its manifest, written last:
every file's size and SHA-256. An upload removes the old manifest before it copies anything, so a reader never takes
a folder mid-upload for a whole one, and :func:`fetch` checks every file it downloads against the manifest.

Files move through ``pyarrow.fs`` (already a dependency of the lake). Its S3 and Azure settings are read from the
lake's Delta ``storage_options``, under the same keys delta-rs reads (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...;
``account_name``, ``account_key``, ``sas_token``, ``client_id``/``client_secret``/``tenant_id``, ``use_emulator``,
...), and whatever they leave out from the same environment variables, so that checkpoints go where the tables go
with the credentials the tables use. Google Cloud Storage takes Google's default credentials
(``GOOGLE_APPLICATION_CREDENTIALS``), which delta-rs reads too; a service-account key given only in the storage
options is an error naming the variable to set, since pyarrow cannot take it."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

MANIFEST = "_cowork_manifest.json"


class ModelStoreError(RuntimeError):
    """A model folder in the object store is missing, incomplete or does not match its manifest."""


def _option(options: Mapping[str, str], *names: str) -> str | None:
    """The first of ``names`` the storage options set (any case), else the first AWS_*/AZURE_* variable among
    them (the variables delta-rs falls back on)."""
    lower = {k.lower(): v for k, v in options.items()}
    env = [os.environ.get(n.upper()) for n in names if n.startswith(("aws_", "azure_"))]
    for value in [lower.get(n.lower()) for n in names] + env:
        if value:
            return str(value)
    return None


# Azurite's well-known development account (what delta-rs uses with use_emulator and no credentials).
_AZURITE_ACCOUNT = "devstoreaccount1"
_AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_AZURE_SCHEMES = ("az", "azure", "adl", "abfs", "abfss")


def _azure(parsed, opts: Mapping[str, str]):
    """pyarrow's AzureFileSystem and the path in it for an Azure URI, configured from delta-rs's Azure keys: the
    URI forms delta-rs reads (``az://container/path``, ``abfss://container@account.dfs.core.windows.net/path``)."""
    import pyarrow.fs as pafs

    container, account = parsed.hostname or "", None
    if parsed.username:  # the Hadoop form: <container>@<account>.dfs.core.windows.net
        container, host = parsed.username, parsed.hostname or ""
        if ".dfs." not in host and ".blob." not in host:
            raise ModelStoreError(f"cannot read the Azure URI {parsed.geturl()}: expected "
                                  "<container>@<account>.dfs.core.windows.net")
        account = host.split(".", 1)[0]
    if not container:
        raise ModelStoreError(f"the Azure URI {parsed.geturl()} names no container")
    account = account or _option(opts, "azure_storage_account_name", "account_name")
    kwargs: dict = {}
    emulator = (_option(opts, "azure_storage_use_emulator", "use_emulator") or "").lower() == "true"
    endpoint = _option(opts, "azure_storage_endpoint", "azure_endpoint", "endpoint")
    if emulator:  # as delta-rs: the emulator's address comes from AZURITE_BLOB_STORAGE_URL, never the endpoint
        endpoint = os.environ.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
        account = account or _AZURITE_ACCOUNT
    if not account:
        raise ModelStoreError(f"{parsed.geturl()}: name the storage account (account_name in the lake's "
                              "storage_options, or AZURE_STORAGE_ACCOUNT_NAME)")
    if endpoint:
        ep = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        host = ep.netloc
        # <account>.blob.<cloud> (another cloud) is pyarrow's ".blob.<cloud>" authority; any other host is an
        # emulator's, the account then the first segment of the path, as pyarrow (and Azurite) place it.
        authority = host[len(account):] if host.lower().startswith(f"{account.lower()}.") else host
        kwargs.update(blob_storage_authority=authority, blob_storage_scheme=ep.scheme,
                      dfs_storage_authority=authority.replace(".blob.", ".dfs."), dfs_storage_scheme=ep.scheme)
    key = _option(opts, "azure_storage_account_key", "azure_storage_access_key", "azure_storage_master_key",
                  "account_key", "access_key", "master_key")
    sas = _option(opts, "azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token")
    client = {name: _option(opts, *names) for name, names in (
        ("client_id", ("azure_storage_client_id", "azure_client_id", "client_id")),
        ("client_secret", ("azure_storage_client_secret", "azure_client_secret", "client_secret")),
        ("tenant_id", ("azure_storage_tenant_id", "azure_storage_authority_id", "azure_tenant_id",
                       "azure_authority_id", "tenant_id", "authority_id")))}
    if emulator:  # as delta-rs: the emulator takes an account key, Azurite's well-known one unless given
        key = key or _AZURITE_KEY
    # the credential delta-rs would take, in its order of precedence
    if _option(opts, "azure_storage_token", "bearer_token", "token"):
        raise ModelStoreError(f"{parsed.geturl()}: a bearer token cannot be handed to pyarrow, which moves the "
                              "checkpoints; give an account key, a SAS token or a client id and secret instead")
    if key:
        kwargs["account_key"] = key
    elif all(client.values()):  # a service principal
        kwargs.update(client)
    elif sas:
        kwargs["sas_token"] = sas.lstrip("?")
    elif client["client_id"]:  # a user-assigned managed identity
        kwargs["client_id"] = client["client_id"]
    # else pyarrow's DefaultAzureCredential (environment, workload or managed identity, Azure CLI)
    path = f"{container}{parsed.path}".rstrip("/")
    return pafs.AzureFileSystem(account_name=account, **kwargs), path


def filesystem(uri: str, storage_options: Mapping[str, str] | None = None):
    """(pyarrow filesystem, path inside it) for ``uri``: s3:// (and s3a://) and Azure's schemes with the Delta
    storage options, any other scheme pyarrow knows (gs://, ...) with its default credentials."""
    import pyarrow.fs as pafs

    parsed = urlparse(uri)
    if parsed.scheme in _AZURE_SCHEMES:
        return _azure(parsed, storage_options or {})
    if parsed.scheme in ("gs", "gcs"):
        given = sorted(k for k in (storage_options or {}) if k.lower().removeprefix("google_") in (
            "service_account", "service_account_path", "service_account_key", "application_credentials"))
        if given:
            raise ModelStoreError(f"{uri}: checkpoints move through pyarrow, which takes Google's default "
                                  f"credentials only: point GOOGLE_APPLICATION_CREDENTIALS at the key file "
                                  f"instead of the storage option {given[0]} (delta-rs reads it too)")
        fs, path = pafs.FileSystem.from_uri(f"gs://{parsed.netloc}{parsed.path}")
        return fs, path.rstrip("/")
    if parsed.scheme in ("s3", "s3a"):
        opts = storage_options or {}
        kwargs: dict = {}
        endpoint = _option(opts, "aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
        if endpoint:
            ep = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs["endpoint_override"], kwargs["scheme"] = ep.netloc + ep.path.rstrip("/"), ep.scheme
        if (_option(opts, "aws_allow_http", "allow_http") or "").lower() == "true" and "scheme" not in kwargs:
            kwargs["scheme"] = "http"
        for key, names in (("region", ("aws_region", "region", "aws_default_region")),
                           ("access_key", ("aws_access_key_id", "access_key_id")),
                           ("secret_key", ("aws_secret_access_key", "secret_access_key")),
                           ("session_token", ("aws_session_token", "session_token", "aws_token", "token"))):
            value = _option(opts, *names)
            if value:
                kwargs[key] = value
        return pafs.S3FileSystem(**kwargs), f"{parsed.netloc}{parsed.path}".rstrip("/")
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path.rstrip("/")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_of(folder: Path) -> dict:
    """Every file under ``folder`` (relative path -> size and SHA-256), the manifest an upload writes."""
    from cowork_pipeline.training.registry import _files

    files = [p for p in _files(folder) if p.name != MANIFEST]
    return {"files": {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _digest(p)} for p in files}}


def upload(local: Path, uri: str, storage_options: Mapping[str, str] | None = None) -> dict:
    """Copy the model folder ``local`` to ``uri`` (replacing what is there) and write its manifest last; returns it."""
    import pyarrow.fs as pafs

    local = Path(local)
    if not local.is_dir():
        raise ModelStoreError(f"no model folder to upload at {local}")
    (local / MANIFEST).unlink(missing_ok=True)  # an earlier upload's: it must not be copied as this one's
    fs, root = filesystem(uri, storage_options)
    manifest = {**manifest_of(local), "written_at": time.time(), "upload_id": uuid.uuid4().hex}
    try:
        _withdraw(fs, root)  # (files an earlier upload had and this one has not go too)
        pafs.copy_files(str(local), root, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        with fs.open_output_stream(f"{root}/{MANIFEST}") as out:
            out.write(json.dumps(manifest, sort_keys=True).encode())
    except OSError as e:
        raise ModelStoreError(f"could not upload {local} to {uri}: {e}") from e
    (local / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))  # this machine holds this upload: no fetch
    return manifest


def write_file(uri: str, data: bytes, storage_options: Mapping[str, str] | None = None) -> None:
    """Write one object (a report) whole: an object store's put replaces it in one step."""
    fs, path = filesystem(uri, storage_options)
    try:
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(data)
    except OSError as e:
        raise ModelStoreError(f"could not write {uri}: {e}") from e


def remote_manifest(uri: str, storage_options: Mapping[str, str] | None = None) -> dict | None:
    """The manifest of the store folder ``uri``; None when it has none (missing, or an upload under way)."""
    fs, root = filesystem(uri, storage_options)
    try:
        with fs.open_input_stream(f"{root}/{MANIFEST}") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        if "not found" in str(e).lower() or "nosuchkey" in str(e).lower():
            return None
        raise ModelStoreError(f"could not read the manifest of {uri}: {e}") from e
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise ModelStoreError(f"{uri}/{MANIFEST} is not a model manifest: {e}") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ModelStoreError(f"{uri}/{MANIFEST} is not a model manifest: no 'files' object")
    return manifest


def written_at(uri: str, storage_options: Mapping[str, str] | None = None) -> float:
    """When the store folder ``uri`` was uploaded (epoch seconds); -1 when it has no manifest."""
    manifest = remote_manifest(uri, storage_options)
    return float(manifest.get("written_at", -1.0)) if manifest else -1.0


def fetch(uri: str, dest: Path, storage_options: Mapping[str, str] | None = None, uploaded: bool = True) -> Path:
    """``dest``, holding the files of the store folder ``uri``: downloaded when ``dest`` does not hold this upload
    already, checked file by file against the manifest, and swapped in whole (a reader of ``dest`` never sees a
    half-written folder). ``uploaded=False`` takes a folder that :func:`upload` did not write (a user's base
    checkpoint, copied with any S3 tool): without a manifest, its listing stands in for one (sizes checked, and a
    new listing downloads it again)."""
    import pyarrow.fs as pafs

    dest = Path(dest)
    manifest = remote_manifest(uri, storage_options)
    if manifest is None and not uploaded:
        manifest = _listing(uri, storage_options)
    if manifest is None:
        raise ModelStoreError(f"no model at {uri}: the folder is missing or its upload did not finish ({MANIFEST} absent)")
    local_manifest = dest / MANIFEST
    if local_manifest.is_file():
        try:
            if json.loads(local_manifest.read_text()) == manifest:
                return dest
        except ValueError:
            pass
    fs, root = filesystem(uri, storage_options)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.fetch-", dir=dest.parent))
    try:
        for rel in manifest["files"]:
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise ModelStoreError(f"{uri}/{MANIFEST} names a file outside the folder: {rel!r}")
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(f"{root}/{rel}", str(tmp / rel), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        got, want = manifest_of(tmp)["files"], manifest["files"]
        if manifest.get("listing"):  # (no digests to check: sizes only)
            got, want = ({rel: f["bytes"] for rel, f in files.items()} for files in (got, want))
        if got != want:
            bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))[:5]
            raise ModelStoreError(f"{uri} does not match its manifest (re-uploaded meanwhile, or damaged): {bad}")
        (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True))
        old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise ModelStoreError(f"could not download {uri} to {dest}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _listing(uri: str, storage_options: Mapping[str, str] | None = None) -> dict | None:
    """A manifest made from the store's listing of ``uri`` (sizes and modification times, no digests); None when
    nothing is there."""
    import pyarrow.fs as pafs

    fs, root = filesystem(uri, storage_options)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as e:
        raise ModelStoreError(f"could not list {uri}: {e}") from e
    files = {i.path[len(root) + 1:]: {"bytes": int(i.size or 0), "mtime": i.mtime.timestamp() if i.mtime else None}
             for i in infos if i.type == pafs.FileType.File}
    return {"files": files, "listing": True} if files else None


def store_folders(root_uri: str, storage_options: Mapping[str, str] | None = None) -> list:
    """The model folders under ``root_uri`` (``<lake>/models``), as registry ``ModelFolder``s: written when their
    newest object was (the manifest, for a whole upload), their size in bytes."""
    import pyarrow.fs as pafs

    from cowork_pipeline.training.registry import ModelFolder

    fs, root = filesystem(root_uri, storage_options)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError as e:
        raise ModelStoreError(f"could not list the model folders in {root_uri}: {e}") from e
    newest: dict[str, float] = {}
    size: dict[str, int] = {}
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        name = info.path[len(root) + 1:].split("/", 1)[0]
        newest[name] = max(newest.get(name, -1.0), info.mtime.timestamp() if info.mtime else -1.0)
        size[name] = size.get(name, 0) + int(info.size or 0)
    base = root_uri.rstrip("/")
    return [ModelFolder(name, f"{base}/{name}", newest[name], size[name]) for name in sorted(newest)]


def delete_folder(uri: str, storage_options: Mapping[str, str] | None = None) -> None:
    """Delete the store folder ``uri`` (:func:`_withdraw`); a folder already gone is no error."""
    fs, root = filesystem(uri, storage_options)
    try:
        _withdraw(fs, root)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ModelStoreError(f"could not delete {uri}: {e}") from e


def _withdraw(fs, root: str) -> None:
    """Delete a store folder, its manifest first: from then on readers see an incomplete folder, never a partial one
    as whole (what an upload does before it copies, and a vacuum to delete)."""
    import pyarrow.fs as pafs

    if fs.get_file_info(f"{root}/{MANIFEST}").type != pafs.FileType.NotFound:
        fs.delete_file(f"{root}/{MANIFEST}")
    if fs.get_file_info(root).type == pafs.FileType.Directory:
        fs.delete_dir(root)
