"""armllm on Ray (armllm/ray.py), on a real Ray cluster of two one-CPU nodes
started here (`ray start` twice, like two machines): Ray Serve replicas answer
the official openai client as `armllm serve` does, with per-replica metrics; a
replica killed mid-stream fails its request at once and comes back; replicas
sharing a machine of two (faked) NUMA nodes take one node's CPU each, a
replacement the one freed; Ray Data's Generator and Embedder equal the
in-process LLM; and the default install never imports Ray."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.engine.test_topology import fake_sysfs
from tests.fake_hub import FakeHub, tiny_repo
from tests.server.conftest import ServerProcess, free_port, running_server
from tests.tiny_model import write_tiny_llama

try:
    import ray
    from ray import serve
except ImportError as exc:  # no Ray wheel here (an emulated aarch64 root, say)
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Ray tests; Ray is missing ({exc}): pip install "
                    "-e '.[test]'", pytrace=False)
    pytest.skip(f"needs Ray: pip install 'armllm[ray]' ({exc})", allow_module_level=True)

from armllm import LLM, SamplingParams  # noqa: E402
from armllm.engine.topology import format_cpulist  # noqa: E402
from armllm.ray import Embedder, Generator, app_builder, build_app  # noqa: E402

# the engine both sides run: float32 weights and KV cache, so greedy tokens are exact
ENGINE = {"dtype": "float32", "kv_cache_dtype": "f32", "kv_cache_gib": 0.02,
          "max_num_seqs": 16, "threads": 1}
ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-dtype", "f32", "--kv-cache-gib", "0.02",
                "--max-num-seqs", "16", "--threads", "1", "--served-model-name", "tiny"]
# the tiny model's context, raised so that one stream outlasts killing its replica
LONG_CONTEXT = 16384
GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
STARTUP_S = 120   # a node, an app or a replica coming up (seconds, generous for CI)


# ---- the cluster ----

def _ray_start(flags: list[str], temp_dir: Path, env: dict) -> None:
    r = subprocess.run(["ray", "start", "--num-cpus", "1", "--node-ip-address", "127.0.0.1",
                        "--temp-dir", str(temp_dir), "--disable-usage-stats",
                        "--dashboard-agent-listen-port", str(free_port()), *flags],
                       env=env, capture_output=True, text=True, timeout=STARTUP_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def _cluster_processes(root: Path, port: int) -> set[int]:
    """The processes of the cluster: those naming its temp dir or its GCS port (the Ray
    client server), and all their descendants (workers, agents)."""
    table = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            table[int(d.name)] = (int(fields[1]), cmd)
    gcs = re.compile(rf"--address=\S+:{port}(\s|$)")
    found = {pid for pid, (_, cmd) in table.items()
             if str(root) in cmd or gcs.search(cmd)} - {os.getpid()}
    grew = True
    while grew:
        children = {pid for pid, (parent, _) in table.items() if parent in found} - found
        found |= children
        grew = bool(children)
    return found


def _stop_cluster(root: Path, port: int) -> None:
    """Kills the cluster's processes (only this cluster's, by pid) until none is left."""
    deadline = time.monotonic() + 30
    while pids := _cluster_processes(root, port):
        assert time.monotonic() < deadline, f"Ray processes left: {sorted(pids)}"
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


NODES = ("head", "worker")
# the faked NUMA nodes' CPUs: the first two this process may use, one node each
NODE_CPUS = sorted(str(c) for c in sorted(os.sched_getaffinity(0))[:2])   # as _replica_cpus


@pytest.fixture(scope="module")
def cluster_root():
    """A head node and a worker node of one CPU each, with their own temp dirs,
    ports and Hugging Face caches (ROOT/NODE/hf; nothing of another cluster on this
    machine is reached); this process is its driver. Yields ROOT."""
    # short: Ray's unix sockets live under it (108-byte path limit)
    root = Path(tempfile.mkdtemp(prefix="armllm-ray-", dir="/tmp"))
    port = free_port()
    with pytest.MonkeyPatch.context() as env:  # for the nodes, this driver, the CLIs run
        env.delenv("RAY_ADDRESS", raising=False)
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        # no token authentication (on by default where ~/.ray/auth_token exists, which
        # a local ray.init() writes; the worker node would need the token too)
        env.setenv("RAY_AUTH_MODE", "disabled")
        # this machine as two NUMA nodes of one CPU each (the CPUs its replicas claim)
        env.setenv("ARMLLM_SYSFS", str(fake_sysfs(root / "sysfs", dict(enumerate(NODE_CPUS)))))
        with _running_cluster(root, port, f"127.0.0.1:{port}"):
            yield root


@pytest.fixture(scope="module")
def cluster(cluster_root) -> str:
    """The cluster's GCS address."""
    return (cluster_root / "address").read_text()


@contextmanager
def _running_cluster(root: Path, port: int, address: str):
    # each node's own Hugging Face cache, as on two machines
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    env = {node: {**base, "HF_HOME": str(root / node / "hf")} for node in NODES}
    (root / "address").write_text(address)
    try:
        _ray_start(["--head", "--port", str(port), "--include-dashboard=false",
                    "--dashboard-port", str(free_port()),
                    "--ray-client-server-port", str(free_port())], root / "head", env["head"])
        _ray_start(["--address", address], root / "worker", env["worker"])
        ray.init(address=address)
        deadline = time.monotonic() + STARTUP_S
        while sum(n["Alive"] for n in ray.nodes()) < 2:
            assert time.monotonic() < deadline, ray.nodes()
            time.sleep(0.2)
        yield
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop_cluster(root, port)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-ray"), max_position=LONG_CONTEXT)


@pytest.fixture(scope="module")
def reference(model):
    """The in-process engine the replicas and the actors must equal."""
    with LLM(model, **ENGINE) as llm:
        yield llm


@pytest.fixture
def serve_port(cluster):
    """Ray Serve running on the cluster with its proxy on a free port; the apps
    deleted and Serve stopped afterwards (their CPUs back for the next test)."""
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield port
    finally:
        serve.shutdown()


def _wait_for(predicate, what: str, timeout: float = STARTUP_S):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.2)
    return value


def _replica_samples(url: str, name: str) -> dict[str, float]:
    """One /metrics scrape (one replica's): {replica label: value of `name`}."""
    found = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        m = re.match(name + r'\{.*replica="([^"]+)".*\} (\S+)$', line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


# ---- serving ----

def _answers(base_url: str) -> dict:
    """Greedy chat, completion and both streamed, through the official client."""
    import openai
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "w3 w4 w5"}]
    chat = client.chat.completions.create(model="tiny", messages=messages, **GREEDY)
    completion = client.completions.create(model="tiny", prompt="w1 w2 w3", **GREEDY)
    chat_stream = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=messages, stream=True, **GREEDY) if c.choices)
    completion_stream = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="w1 w2 w3", stream=True, **GREEDY))
    return {"chat": chat.choices[0].message.content, "completion": completion.choices[0].text,
            "chat_stream": chat_stream, "completion_stream": completion_stream,
            "usage": completion.usage.completion_tokens}


def test_armllm_serve_ray_answers_as_armllm_serve(cluster, model, tmp_path_factory):
    """`armllm serve --ray`: 2 replicas x 1 thread, one per node, give the openai
    client the greedy output a plain `armllm serve` gives, streamed or not; both
    replicas serve (their /metrics samples carry replica="<id>"); SIGTERM deletes
    the app and exits 0."""
    with running_server(model, tmp_path_factory, "plain", *ENGINE_FLAGS) as plain:
        expected = _answers(plain.url)
    assert expected["usage"] == GREEDY["max_tokens"]
    with running_server(model, tmp_path_factory, "ray", *ENGINE_FLAGS, "--ray",
                        "--ray-address", cluster, "--num-replicas", "2") as srv:
        assert _answers(srv.url) == expected
        # more at once than one replica takes (max_num_seqs + spare), each long enough
        # to be running while the others arrive: whichever proxy gets them hands the
        # rest to the other node's replica
        with ThreadPoolExecutor(32) as pool:
            for r in pool.map(lambda i: httpx.post(srv.url + "/v1/completions", json={
                    "prompt": f"w{i + 1}", "max_tokens": 1000, "ignore_eos": True},
                    timeout=60), range(32)):
                assert r.status_code == 200, r.text
        served: dict[str, float] = {}

        def both_seen() -> bool:
            served.update(_replica_samples(srv.url, "armllm:generation_tokens_total"))
            return len(served) == 2
        _wait_for(both_seen, "scrape of each replica", timeout=30)
        assert all(tokens > 0 for tokens in served.values()), served
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0, srv.log()
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True)
                if a["name"].startswith("SERVE_")], "Serve is still running"


def test_a_hub_model_is_pinned_and_downloaded_by_each_replica_where_it_runs(
        cluster_root, cluster, tmp_path, monkeypatch):
    """`armllm serve --ray ORG/NAME`: the driver checks the name (config.json is all
    it fetches); each replica downloads the checkpoint into its own node's cache at
    the commit the driver saw, with the driver's HF_ENDPOINT; the model is served
    under the name typed and answers as the same checkpoint loaded in process."""
    fake_hub = FakeHub(tmp_path / "hub")
    try:
        source = tiny_repo(fake_hub)
        commit = fake_hub.commit("org/tiny", "main")
        for key in [k for k in os.environ if k.startswith(("HF_", "HUGGING_FACE_"))]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "driver-hf"))
        flags = [f for f in ENGINE_FLAGS if f not in ("--served-model-name", "tiny")]
        srv = ServerProcess("org/tiny", *flags, "--ray", "--ray-address", cluster,
                            "--num-replicas", "2", log=tmp_path / "serve.log")
        try:
            srv.wait_ready(STARTUP_S)
            models = httpx.get(srv.url + "/v1/models", timeout=10).json()
            assert [m["id"] for m in models["data"]] == ["org/tiny"]
            answer = httpx.post(srv.url + "/v1/completions", timeout=30, json={
                "model": "org/tiny", "prompt": "w7 w8", "max_tokens": 6, "temperature": 0,
                "ignore_eos": True}).json()
        finally:
            srv.stop()
        with LLM(source, **ENGINE) as local:
            expected = local.generate("w7 w8", SamplingParams(temperature=0, max_tokens=6,
                                                               ignore_eos=True))[0]
        assert answer["choices"][0]["text"] == expected.text
        snapshot = Path("hub") / "models--org--tiny" / "snapshots" / commit
        for node in NODES:   # both replicas ran, one on each node
            weights = cluster_root / node / "hf" / snapshot / "model.safetensors"
            assert weights.read_bytes() == (source / "model.safetensors").read_bytes(), node
        driver = tmp_path / "driver-hf" / snapshot
        assert (driver / "config.json").is_file()
        assert not (driver / "model.safetensors").exists()
        weight_gets = [r for r in fake_hub.requests
                       if r.method == "GET" and r.path.endswith("/model.safetensors")]
        assert [r.path for r in weight_gets] == \
            [f"/org/tiny/resolve/{commit}/model.safetensors"] * 2
    finally:
        fake_hub.stop()


def test_serve_run_app_builder(cluster, model, reference, serve_port):
    """Ray's own command line runs the application builder, key=value arguments
    converted to their types."""
    r = subprocess.run(["serve", "run", "--address", cluster, "--non-blocking",
                        "armllm.ray:app_builder", f"model={model}", "num_replicas=1",
                        "threads=1", "dtype=float32", "kv_cache_dtype=f32",
                        "kv_cache_gib=0.02", "served_model_name=tiny",
                        "enable_prefix_caching=false"],
                       capture_output=True, text=True, timeout=STARTUP_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    answer = httpx.post(f"http://127.0.0.1:{serve_port}/v1/completions", json={
        "model": "tiny", "prompt": "w7 w8", "max_tokens": 6, "temperature": 0,
        "ignore_eos": True}).json()
    expected = reference.generate("w7 w8", SamplingParams(temperature=0, max_tokens=6,
                                                           ignore_eos=True))[0]
    assert answer["choices"][0]["text"] == expected.text


def _streaming_replica(url: str) -> str:
    """The actor name of the replica running the one request in flight: the replica
    that answers a scrape if it runs it, else the other one."""
    (replica, running), = _replica_samples(url, "armllm:num_requests_running").items()
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith("SERVE_REPLICA::armllm#armllm#")]
    assert len(names) == 2, names
    return next(n for n in names if n.endswith("#" + replica) == (running == 1))


def _replica_cpus(root: Path) -> list[str]:
    """The CPUs each live replica of the cluster at `root` has its engine bound to:
    the one CPU list, other than the machine's, that its process's threads (the
    engine's, the loader's) run on. Replicas are the processes Ray titles
    ray::ServeReplica:armllm:..."""
    machine = {format_cpulist(tuple(os.sched_getaffinity(0)))}
    port = int((root / "address").read_text().rsplit(":", 1)[1])
    found = []
    for pid in _cluster_processes(root, port):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(
                    b"ray::ServeReplica:armllm:"):
                continue
            lists = {re.search(r"Cpus_allowed_list:\s*(\S+)", (task / "status").read_text())
                     .group(1) for task in Path(f"/proc/{pid}/task").iterdir()}
        except OSError:   # it exited meanwhile
            continue
        bound = lists - machine
        assert len(bound) <= 1, (pid, lists)
        found.append(bound.pop() if bound else "unbound")   # unbound: still starting
    return sorted(found)


def test_a_killed_replica_fails_its_stream_and_comes_back(cluster_root, cluster, model,
                                                          serve_port):
    """Killing the replica serving a long stream ends that stream with an error at
    once (no hang); the other replica serves meanwhile, and Ray starts a new one.
    The two replicas, on one machine of two NUMA nodes, each run on a node's CPU of
    their own; the new one on the CPU the killed one freed."""
    serve.run(build_app(model, num_replicas=2, served_model_name="tiny", **ENGINE),
              name="armllm", route_prefix="/")
    assert _replica_cpus(cluster_root) == NODE_CPUS
    url = f"http://127.0.0.1:{serve_port}"
    body = {"model": "tiny", "prompt": "w1 w2", "max_tokens": LONG_CONTEXT - 8,
            "temperature": 0, "ignore_eos": True, "stream": True}
    tokens, killed_at = 0, None
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=20) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                assert killed_at is None or time.monotonic() - killed_at < 10, "no error"
                if not line.startswith("data: {"):
                    continue
                tokens += 1
                if tokens == 20:
                    ray.kill(ray.get_actor(_streaming_replica(url), namespace="serve"))
                    killed_at = time.monotonic()
    assert killed_at is not None and time.monotonic() - killed_at < 10
    assert tokens < LONG_CONTEXT // 2
    short = {"model": "tiny", "prompt": "w1 w2", "max_tokens": 4}
    assert httpx.post(url + "/v1/completions", json=short, timeout=30).status_code == 200

    def two_running() -> bool:
        deployment = serve.status().applications["armllm"].deployments["armllm"]
        return deployment.replica_states.get("RUNNING") == 2
    _wait_for(two_running, "replacement replica")
    for _ in range(6):
        assert httpx.post(url + "/v1/completions", json=short, timeout=30).status_code == 200
    # the replacement (its process up once Ray sees the death) takes the freed CPU
    deadline = time.monotonic() + STARTUP_S
    while (cpus := _replica_cpus(cluster_root)) != NODE_CPUS:
        assert time.monotonic() < deadline, cpus
        time.sleep(0.2)


def test_an_engine_claims_cpus_of_one_node_unless_it_takes_the_machine(cluster_root):
    """_claimed (a replica's, an actor's engine arguments): threads=1 on the faked
    two-node machine gets a node's CPU no other engine holds, the next one the other
    node's, a third none (unpinned); the whole machine's threads or given CPUs are
    left as they are."""
    from armllm.ray import _claimed
    _wait_for(lambda: not _replica_cpus(cluster_root), "exit of the last test's replicas")
    first, claim0 = _claimed({"threads": 1, "dtype": "float32"})
    second, claim1 = _claimed({"threads": 1})
    try:
        assert sorted([first["cpus"], second["cpus"]]) == NODE_CPUS
        assert first["dtype"] == "float32"
        assert {claim0.node, claim1.node} == {0, 1}
        assert _claimed({"threads": 1}) == ({"threads": 1}, None)   # both nodes taken
    finally:
        claim0.release()
        claim1.release()
    machine = {"threads": len(os.sched_getaffinity(0))}
    assert _claimed(machine) == (machine, None)
    assert _claimed({"threads": 1, "cpus": "1"}) == ({"threads": 1, "cpus": "1"}, None)


def test_build_app_refuses_what_a_replica_cannot_honour(model):
    for bad, match in [({"data_parallel_size": 2}, "data_parallel_size=2"),
                       ({"tensor_parallel_size": 2}, "tensor_parallel_size=2"),
                       ({"num_replicas": 0}, "num_replicas"),
                       ({"num_replicas": 2, "autoscaling_config": {"max_replicas": 3}},
                        "exclude each other"),
                       ({"max_num_seqs": 0}, "max_num_seqs"),
                       ({"bogus": 1}, "bogus")]:
        with pytest.raises(ValueError, match=match):
            build_app(model, **bad)
    with pytest.raises(ValueError, match="/no/such/model: no such model file or directory"):
        build_app("/no/such/model")
    with pytest.raises(ValueError, match="threads must be int"):
        app_builder({"model": str(model), "threads": "two"})
    deployment = app_builder({"model": str(model), "threads": "2", "num_replicas": "3",
                              "enable_prefix_caching": "false"})._bound_deployment
    assert deployment.num_replicas == 3
    assert deployment.ray_actor_options["num_cpus"] == 2
    assert deployment.init_args[0].engine_args["enable_prefix_caching"] is False


@pytest.mark.parametrize("flags, message", [
    (["--ray", "--limit-concurrency", "8"], "--limit-concurrency does not apply under --ray"),
    (["--ray", "-dp", "2"], "--data-parallel-size does not apply under --ray"),
    (["--num-replicas", "2"], "--num-replicas needs --ray"),
])
def test_serve_refuses_flags_that_do_not_apply(model, flags, message):
    r = subprocess.run([sys.executable, "-m", "armllm", "serve", str(model), *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == f"armllm: error: {message}"


# ---- batch inference ----

PROMPTS = [" ".join(f"w{(7 * i + j) % 100 + 1}" for j in range(2 + i % 5)) for i in range(64)]
SAMPLING = {"temperature": 0, "max_tokens": 10, "ignore_eos": True}


def _map(rows: list[dict], fn, **kwargs) -> list[dict]:
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items(rows).map_batches(
        fn, fn_constructor_kwargs={"model": str(kwargs.pop("model")), **kwargs},
        compute=ray.data.ActorPoolStrategy(size=2), batch_size=16, num_cpus=1)
    return ds.take_all()


def test_ray_data_generator_equals_llm_generate(cluster, model, reference):
    rows = _map([{"id": i, "prompt": p} for i, p in enumerate(PROMPTS)], Generator,
                model=model, sampling=SAMPLING, **ENGINE)
    assert len(rows) == len(PROMPTS)
    rows.sort(key=lambda row: row["id"])
    expected = reference.generate(PROMPTS, SamplingParams(**SAMPLING))
    for row, prompt, out in zip(rows, PROMPTS, expected, strict=True):
        assert row["prompt"] == prompt
        assert list(row["generated_token_ids"]) == out.token_ids
        assert row["generated_text"] == out.text
        assert row["finish_reason"] == "length"
        assert row["num_prompt_tokens"] == len(out.prompt_token_ids)
        assert row["num_generated_tokens"] == SAMPLING["max_tokens"]
        assert 0 < row["ttft_s"] <= row["e2e_s"]


def test_ray_data_generator_renders_a_messages_column(cluster, model, reference):
    conversations = [[{"role": "system", "content": "w9"}, {"role": "user", "content": p}]
                     for p in PROMPTS[:8]]
    rows = _map([{"id": i, "messages": c} for i, c in enumerate(conversations)], Generator,
                model=model, sampling=SAMPLING, **ENGINE)
    rows.sort(key=lambda row: row["id"])
    expected = reference.generate([reference.chat_prompt(c) for c in conversations],
                                  SamplingParams(**SAMPLING))
    assert [row["messages"] for row in rows] == conversations
    assert [list(row["generated_token_ids"]) for row in rows] == [o.token_ids for o in expected]


def test_ray_data_embedder_equals_llm_embed(cluster, model, reference):
    rows = _map([{"id": i, "text": p} for i, p in enumerate(PROMPTS[:16])], Embedder,
                model=model, **ENGINE)
    rows.sort(key=lambda row: row["id"])
    expected = reference.embed(PROMPTS[:16])
    for row, out in zip(rows, expected, strict=True):
        assert row["embedding"].dtype == np.float32
        np.testing.assert_array_equal(row["embedding"], out.embedding)


def test_generator_checks_its_arguments(model):
    with pytest.raises(ValueError, match="n must be 1"):
        Generator(model, sampling={"n": 2}, **ENGINE)
    with pytest.raises(ValueError, match="'temp' is not a SamplingParams field"):
        Generator(model, sampling={"temp": 0}, **ENGINE)
    generator = Generator(model, sampling=SAMPLING, **ENGINE)
    with pytest.raises(ValueError, match="neither a 'prompt' nor a 'messages' column"):
        generator({"text": np.array(["w1"])})


# ---- the default install ----

def test_the_default_install_does_not_import_ray(model):
    """armllm, its APIs, its server and `armllm serve`'s command line without --ray
    never import Ray."""
    code = ("import sys, armllm, armllm.api, armllm.server.app, armllm.server.serving, "
            "armllm.cli\n"
            f"armllm.cli._build_parser().parse_args(['serve', {str(model)!r}])\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"

