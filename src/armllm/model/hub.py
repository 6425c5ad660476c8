"""hub: models by name from the Hugging Face Hub. Owns the name grammar, the
choice of the files armllm loads from a repo, and their download (with
huggingface_hub, into its cache) to a local path the loader reads: a snapshot
directory, or one .gguf file.

Names (a local path that exists always wins; anything else that does not look
like ORG/NAME is left to the loader, which reports the missing path):

  ORG/NAME[@REVISION]            a Hugging Face checkpoint: config.json (read first:
                                 an architecture armllm does not run is refused before
                                 any weight is fetched), generation_config.json, the
                                 safetensors weights (the shards model.safetensors.index.json
                                 names, else every top-level *.safetensors), the tokenizer
                                 files, and sentence-transformers' modules.json,
                                 config_sentence_transformers.json and each module's
                                 config.json (1_Pooling/config.json). Never pickles
                                 (*.bin, *.pt, *.pth, *.pkl), ONNX or any other file.
                                 A repo of GGUF files only: its Q4_K_M file if exactly one
                                 file has that tag (llama-server's default), else its only
                                 GGUF file, else an error listing the quants to choose from.
                                 A CTranslate2 model (model.bin: faster-whisper's
                                 Systran/faster-whisper-*): model.bin, tokenizer.json,
                                 config.json, preprocessor_config.json, vocabulary.*.
  ORG/NAME[@REVISION]:QUANT      the one GGUF file whose name carries the tag QUANT
                                 (case-insensitive, as a whole token: Q4_K does not match
                                 Q4_K_M, Q4_XS not IQ4_XS); mmproj files never match.
  ORG/NAME/FILE.gguf[@REVISION]  that GGUF file (a path in the repo; may name folders).

REVISION is a branch, tag or commit (default: main). Split GGUFs
(-00001-of-0000N.gguf) are refused: the loader reads single files.

Everything huggingface_hub honours applies: HF_TOKEN (or a saved login) for
gated and private repos, HF_HOME / HF_HUB_CACHE for the cache, HF_ENDPOINT
for a mirror, HF_HUB_OFFLINE=1 for no network at all (the cached snapshot of
the revision is used; the choice of a GGUF is then among the cached files).
When the Hub cannot be reached or refuses, a cached snapshot is used too (with
a warning). Download progress bars are huggingface_hub's (on a terminal only).
Every failure is a HubError (a ValueError) with a one-line message naming the repo.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import huggingface_hub
from huggingface_hub import constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import validate_repo_id

from armllm.model.arch import GGUF_ARCHITECTURES, config_from_hf

log = logging.getLogger(__name__)

NAME = re.compile(r"""
    (?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)   # ORG/NAME
    (?:/(?P<file>[^@:]+\.gguf))?                     # /FILE.gguf, folders allowed
    (?:@(?P<revision>[^:]+))?                        # @REVISION (git refs hold no ':')
    (?::(?P<quant>[^:]*))?                           # :QUANT
    """, re.VERBOSE | re.ASCII)
NAME_GRAMMAR = "ORG/NAME[@REVISION][:QUANT] or ORG/NAME/FILE.gguf[@REVISION]"
COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_QUANT = "Q4_K_M"    # llama-server -hf's default
CONFIG = "config.json"
CT2_MODEL = "model.bin"   # a CTranslate2 model (faster-whisper's layout)
CT2_SIDE_FILES = ("tokenizer.json", "config.json", "preprocessor_config.json",
                  "vocabulary.json", "vocabulary.txt")
INDEX = "model.safetensors.index.json"
# the small files a checkpoint may carry that armllm reads: sampling defaults, the
# tokenizer and chat template, sentence-transformers' pooling
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
              "modules.json", "config_sentence_transformers.json")
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
# the quant tag in a GGUF file name, to list the choices (llama.cpp's type names)
QUANT_TAG = re.compile(r"(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|TQ\d_\d|B?F16|F32|MXFP4)"
                       r"(?![A-Za-z0-9])", re.IGNORECASE)
PICKLES = "*.bin, *.pt, *.pth, *.pkl"


class HubError(ValueError):
    """A model name the Hub (or the cache) cannot give; the message names the repo."""


@dataclass(frozen=True)
class HubName:
    """A parsed model name."""
    repo_id: str
    revision: str | None = None   # None: the default branch (main)
    quant: str | None = None
    filename: str | None = None   # a .gguf path in the repo

    @property
    def label(self) -> str:
        """The repo (and revision) as error messages name it."""
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class _Listing:
    commit: str
    files: tuple[str, ...]
    cached: bool               # listed from the local cache, not the Hub
    gguf_arch: str | None = None   # the Hub's general.architecture of a GGUF repo


def parse_name(text: str) -> HubName | None:
    """The Hub name `text` spells, or None if it does not look like one (ORG/NAME
    first). Raises HubError for a Hub name with a malformed tail."""
    if not re.match(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9]", text, re.ASCII) \
            or re.fullmatch(r"[^/]+/[^/@:]+\.gguf", text, re.IGNORECASE):   # a path to a file
        return None
    m = NAME.fullmatch(text)
    try:
        if m is None or m["quant"] == "":
            raise HFValidationError("a malformed name")
        validate_repo_id(m["repo"])   # the Hub's rules: no "--", "..", trailing "." ...
    except HFValidationError:
        raise HubError(f"{text!r}: no such file or directory, and not a Hugging Face Hub "
                       f"model name ({NAME_GRAMMAR})") from None
    if m["file"] and m["quant"]:
        raise HubError(f"{text}: name a GGUF file or a quant, not both")
    return HubName(m["repo"], m["revision"], m["quant"], m["file"])


def resolve(model: str | Path) -> Path:
    """The local path of `model`: the path itself if it exists (or if it is not a Hub
    name: the loader reports it missing), else the Hub name's files, downloaded
    into the Hugging Face cache unless there already."""
    path = Path(model)
    if path.exists():
        return path
    name = parse_name(str(model))
    if name is None:
        return path
    listing = _listing(name)
    gguf = _gguf_file(name, listing)
    if gguf is not None:
        local = _fetch(name, listing, gguf)
    elif CT2_MODEL in listing.files:
        local = _fetch_ct2(name, listing)
    else:
        local = _fetch_checkpoint(name, listing)
    if not listing.cached:
        _record_ref(name, listing.commit)
    return local


def pin(model: str) -> str:
    """For replicas that each download `model` on their own machine (armllm serve
    --ray): a Hub name checked as resolve checks it (the repo, the revision, the
    GGUF file the name picks, a checkpoint's config.json and architecture) without
    fetching any weight, and pinned: the name of the same files at the commit the
    Hub lists now (ORG/NAME@COMMIT, ORG/NAME/FILE.gguf@COMMIT), so that every
    replica serves the same revision even if the branch moves meanwhile. Anything
    else (a local path, a name that is not a Hub name) comes back as it is."""
    if Path(model).exists():
        return model
    name = parse_name(model)
    if name is None:
        return model
    listing = _listing(name)
    gguf = _gguf_file(name, listing)
    if gguf is not None:
        return f"{name.repo_id}/{gguf}@{listing.commit}"
    if CT2_MODEL not in listing.files:
        _checked_config(name, listing)
    return f"{name.repo_id}@{listing.commit}"


def _listing(name: HubName) -> _Listing:
    """The repo's commit and files at the revision: from the Hub, or (offline, or
    the Hub unreachable or refusing) from the cached snapshot."""
    if constants.HF_HUB_OFFLINE:
        cached = _cached_listing(name)
        if cached is None:
            raise HubError(f"{name.label}: not in the Hugging Face cache "
                           f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: unset it "
                           "to download the model")
        return cached
    try:
        info = huggingface_hub.HfApi().model_info(
            name.repo_id, revision=name.revision or constants.DEFAULT_REVISION)
    except RevisionNotFoundError as exc:   # the cache has no snapshot of a missing revision
        raise _explain(name, exc) from None
    except Exception as exc:  # HTTP errors, and the HTTP client's own when the network is down
        cached = _cached_listing(name)
        if cached is None:
            raise _explain(name, exc) from None
        log.warning("%s: the Hub at %s cannot be used (%s): using the cached snapshot",
                    name.label, constants.ENDPOINT, _first_line(exc))
        return cached
    gguf = info.gguf if isinstance(info.gguf, dict) else {}
    return _Listing(info.sha, tuple(s.rfilename for s in info.siblings or ()), False,
                    gguf.get("architecture"))


def _storage(name: HubName) -> Path:
    """The repo's folder in the Hugging Face cache."""
    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name.repo_id,
                                                           repo_type="model")


def _cached_listing(name: HubName) -> _Listing | None:
    """The files of the revision's cached snapshot (refs/REVISION names its commit)."""
    revision = name.revision or constants.DEFAULT_REVISION
    commit = revision
    if not COMMIT.fullmatch(revision):
        ref = _storage(name) / "refs" / revision
        commit = ref.read_text().strip() if ref.is_file() else ""
    snapshot = _storage(name) / "snapshots" / commit
    if not commit or not snapshot.is_dir():
        return None
    files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*")
                   if p.is_file())
    return _Listing(commit, tuple(files), True)


def _record_ref(name: HubName, commit: str) -> None:
    """refs/REVISION -> commit, as huggingface_hub's snapshot_download records it, so
    that an offline run finds the snapshot by the revision's name."""
    revision = name.revision or constants.DEFAULT_REVISION
    ref = _storage(name) / "refs" / revision
    if revision == commit or (ref.is_file() and ref.read_text().strip() == commit):
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)   # atomic: a concurrent reader sees the old commit or the new


def _fetch(name: HubName, listing: _Listing, filename: str) -> Path:
    """One file of the listed commit, from the cache or downloaded into it."""
    try:
        return Path(huggingface_hub.hf_hub_download(name.repo_id, filename,
                                                    revision=listing.commit))
    except Exception as exc:  # as in _listing: HTTP, network, disk
        raise _explain(name, exc, filename) from None


def _fetch_checkpoint(name: HubName, listing: _Listing) -> Path:
    """A Hugging Face checkpoint's files (config.json first, checked) -> its snapshot
    directory."""
    files = set(listing.files)
    config_path = _checked_config(name, listing)
    for filename in SIDE_FILES:
        if filename in files:
            _fetch(name, listing, filename)
    for filename in _module_configs(config_path.parent, files):
        _fetch(name, listing, filename)
    for filename in _weight_files(name, listing, config_path.parent):
        _fetch(name, listing, filename)
    return config_path.parent


def _fetch_ct2(name: HubName, listing: _Listing) -> Path:
    """A CTranslate2 model (faster-whisper's Systran/faster-whisper-*): its tokenizer,
    config and vocabulary first, model.bin last -> its snapshot directory."""
    files = set(listing.files)
    if "tokenizer.json" not in files:
        raise HubError(f"{name.label}: {_where(listing)} has model.bin but no tokenizer.json "
                       "(armllm reads a CTranslate2 model's tokenizer from it)")
    for filename in (*CT2_SIDE_FILES, CT2_MODEL):
        if filename in files:
            local = _fetch(name, listing, filename)
    return local.parent


def _checked_config(name: HubName, listing: _Listing) -> Path:
    """A checkpoint's config.json, fetched and checked as the loader checks it."""
    if CONFIG not in listing.files:
        raise HubError(f"{name.label}: {_where(listing)} has *.safetensors but no "
                       "config.json (armllm loads Hugging Face transformers checkpoints)")
    config_path = _fetch(name, listing, CONFIG)
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise HubError(f"{name.label}: {CONFIG}: not valid JSON: {exc}") from None
    try:   # the loader's own check: the architecture, and every field it reads
        config_from_hf(config if isinstance(config, dict) else {}, CONFIG)
    except ValueError as exc:
        raise HubError(f"{name.label}: {exc}") from None
    return config_path


def _module_configs(snapshot: Path, files: set[str]) -> list[str]:
    """The config.json of each sentence-transformers module modules.json names
    (1_Pooling/config.json), where the repo has one."""
    modules_path = snapshot / "modules.json"
    if not modules_path.is_file():
        return []
    try:
        modules = json.loads(modules_path.read_text())
    except (ValueError, UnicodeDecodeError):
        return []   # the loader reports a malformed modules.json
    paths = [m.get("path") for m in modules if isinstance(m, dict)] \
        if isinstance(modules, list) else []
    wanted = [f"{p.strip('/')}/config.json" for p in paths if isinstance(p, str) and p]
    return [f for f in wanted if f in files]


def _weight_files(name: HubName, listing: _Listing, snapshot: Path) -> list[str]:
    """The safetensors files the loader reads: the shards the index names (the index
    fetched first), else every top-level *.safetensors."""
    if INDEX not in listing.files:
        return [f for f in listing.files if "/" not in f and f.endswith(".safetensors")]
    _fetch(name, listing, INDEX)
    try:
        shards = sorted(set(json.loads((snapshot / INDEX).read_text())["weight_map"].values()))
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise HubError(f"{name.label}: {INDEX} is malformed: {exc}") from None
    missing = [s for s in shards if s not in listing.files]
    if missing:
        raise HubError(f"{name.label}: {INDEX} names {', '.join(missing)}, which "
                       f"{_where(listing)} lacks")
    return shards


def _gguf_file(name: HubName, listing: _Listing) -> str | None:
    """The GGUF file the name picks, or None for a Hugging Face checkpoint."""
    ggufs = [f for f in listing.files if f.endswith(".gguf")]
    has_checkpoint = any(f.endswith(".safetensors") and "/" not in f for f in listing.files) \
        or CT2_MODEL in listing.files
    if not (name.filename or name.quant) and has_checkpoint:
        return None
    if not ggufs and not (name.filename or name.quant):
        raise HubError(f"{name.label}: {_where(listing)} has no *.safetensors, .gguf or "
                       f"CTranslate2 model.bin weights (armllm never loads pickles: "
                       f"{PICKLES})")
    if name.filename:
        if name.filename not in ggufs:
            raise HubError(f"{name.label}: {_where(listing)} has no file {name.filename} "
                           f"(its GGUF files: {', '.join(ggufs) or 'none'})")
        chosen = [name.filename]
    else:
        models = [f for f in ggufs if not PurePosixPath(f).name.lower().startswith("mmproj")]
        tag = re.compile(r"(?<![A-Za-z0-9])" + re.escape(name.quant or DEFAULT_QUANT)
                         + r"(?![A-Za-z0-9_])", re.IGNORECASE)
        chosen = [f for f in models if tag.search(f)]
        if not chosen and not name.quant and len(models) == 1:
            chosen = models
        if not chosen:
            asked = (f"no GGUF file has the quant {name.quant}" if name.quant else
                     f"{len(models)} GGUF files and none is {DEFAULT_QUANT}: choose one as "
                     f"{name.label}:QUANT")
            raise HubError(f"{name.label}: {asked} (available in {_where(listing)}: "
                           f"{_quants(models) or 'none'})")
        if len(chosen) > 1 and len({SPLIT.sub("", f) for f in chosen}) > 1:
            raise HubError(f"{name.label}: the quant {name.quant or DEFAULT_QUANT} matches "
                           f"{len(chosen)} GGUF files ({', '.join(chosen)}): name one as "
                           f"{name.repo_id}/FILE.gguf")
    split = SPLIT.search(chosen[0])
    if split:
        raise HubError(f"{name.label}: {chosen[0]} is part of a GGUF split in "
                       f"{int(split[2])} files; armllm loads single-file GGUFs (merge the "
                       "parts with llama.cpp's llama-gguf-split --merge)")
    if listing.gguf_arch is not None and listing.gguf_arch not in GGUF_ARCHITECTURES:
        raise HubError(f"{name.label}: unsupported GGUF architecture {listing.gguf_arch!r} "
                       f"(supported: {', '.join(GGUF_ARCHITECTURES)})")
    return chosen[0]


def _quants(files: list[str]) -> str:
    """The quant tags of GGUF files (a split counted once; a file without a tag by
    name), for an error message."""
    seen: dict[str, None] = {}
    for f in files:
        tags = QUANT_TAG.findall(PurePosixPath(f).name)
        label = tags[-1].upper() if tags else f
        seen[label + (" (split)" if SPLIT.search(f) else "")] = None
    return ", ".join(sorted(seen))


def _where(listing: _Listing) -> str:
    return "the cached snapshot" if listing.cached else "the repo"


def _explain(name: HubName, exc: Exception, filename: str | None = None) -> HubError:
    """A one-line HubError for what huggingface_hub raised."""
    has_token = huggingface_hub.get_token() is not None
    sent = "the token in HF_TOKEN (or your saved login)" if has_token else "no token"
    what = f"{name.label}: {filename}" if filename else name.label
    cache = constants.HF_HUB_CACHE
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"{name.repo_id}: no revision {name.revision!r} on the Hub "
                        "(a branch, tag or commit)")
    if isinstance(exc, GatedRepoError):
        page = f"{constants.ENDPOINT}/{name.repo_id}"
        if has_token:
            return HubError(f"{name.label}: a gated model, and {sent} has no access to it: "
                            f"accept its terms at {page} with that account")
        return HubError(f"{name.label}: a gated model: accept its terms at {page}, then set "
                        "HF_TOKEN to a token of that account")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(f"{name.label}: no such local path, and no such model on the Hub "
                        f"({constants.ENDPOINT}); if it is private, set HF_TOKEN to a token "
                        f"that can read it (sent: {sent})")
    if isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError):
        return HubError(f"{what}: not in the repo")
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status == 401:
            return HubError(f"{what}: the Hub refused {sent} (HTTP 401): set HF_TOKEN to a "
                            "valid token")
        return HubError(f"{what}: the Hub answered HTTP {status}: "
                        f"{_first_line(exc.server_message or exc)}")
    cause = exc.__cause__ if isinstance(exc, LocalEntryNotFoundError) else exc
    if isinstance(cause, OfflineModeIsEnabled) or (cause is None and constants.HF_HUB_OFFLINE):
        return HubError(f"{what}: not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE "
                        "is set: unset it to download the model")
    if cause is None:
        return HubError(f"{what}: not in the Hugging Face cache ({cache})")
    reason = f"{type(cause).__name__}: {_first_line(cause)}"
    if isinstance(cause, OSError) and not isinstance(cause, ConnectionError) \
            and cause.filename is not None:   # the disk, not the network
        return HubError(f"{what}: cannot store it in {cache}: {reason}")
    return HubError(f"{what}: cannot reach the Hugging Face Hub at {constants.ENDPOINT} "
                    f"({reason}) and it is not in the cache ({cache})")


def _first_line(obj: object) -> str:
    lines = str(obj).strip().splitlines()
    return lines[0] if lines else type(obj).__name__
