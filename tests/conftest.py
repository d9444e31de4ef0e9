"""Shared pytest fixtures."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

import pytest


@pytest.fixture(autouse=True)
def _estimates_in_the_page_run(monkeypatch):
    """AppTest does not run timed fragments: let its page runs wait for a new TensorRT estimate
    instead of drawing "estimating…" (the browser tests' servers keep the short default and poll)."""
    monkeypatch.setenv("MIXPREC_ESTIMATE_WAIT", "120")


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Streamlit's AppTest leaves the script it ran (app.py) as ``sys.modules['__main__']``;
    multiprocessing's spawn would then run app.py in every worker of a later test. Restore it."""
    main = sys.modules.get("__main__")
    yield
    if main is not None:
        sys.modules["__main__"] = main


@pytest.fixture(scope="session")
def trt_reports_dir() -> Path:
    """Real trtexec reports (layer info + profile), in ``shared/`` beside the repo checkout."""
    return Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "trt-engine-reports"


# --- bundled samples (core/model/samples.py): built once per session into one shared temp workspace ---

@pytest.fixture(scope="session")
def samples_workspace(tmp_path_factory):
    """A session workspace holding the materialised samples (reuse it to avoid re-exporting MiniLM)."""
    from core.workspace import Workspace

    return Workspace(tmp_path_factory.mktemp("samples-ws"))


@pytest.fixture(scope="session")
def minilm_sample(samples_workspace):
    """SamplePaths of the minilm sample (torch export runs once per session, ~10 s)."""
    from core.model.samples import materialize_sample

    return materialize_sample("minilm", samples_workspace)


@pytest.fixture(scope="session")
def tiny_cnn_sample(samples_workspace):
    from core.model.samples import materialize_sample

    return materialize_sample("tiny-cnn", samples_workspace)


@pytest.fixture(scope="session")
def tiny_transformer_sample(samples_workspace):
    from core.model.samples import materialize_sample

    return materialize_sample("tiny-transformer", samples_workspace)


# --- projects over the samples (core/project.py), sharing the session workspace ---

@pytest.fixture(scope="session")
def ws(samples_workspace):
    return samples_workspace


@pytest.fixture(scope="session")
def minilm(ws, minilm_sample):
    from core.project import open_project

    return open_project("sample:minilm", ws=ws)


@pytest.fixture(scope="session")
def tiny_cnn(ws, tiny_cnn_sample):
    from core.project import open_project

    return open_project("sample:tiny-cnn", ws=ws)


@pytest.fixture(scope="session")
def tiny_transformer(ws, tiny_transformer_sample):
    from core.project import open_project

    return open_project("sample:tiny-transformer", ws=ws)


def run_model(proto_or_path, feeds):
    """Outputs of a model on a list of feeds (ONNX Runtime, CPU, basic optimizations)."""
    import numpy as np
    import onnxruntime as ort

    src = proto_or_path.SerializeToString() if hasattr(proto_or_path, "SerializeToString") else str(proto_or_path)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    name = sess.get_outputs()[0].name
    return np.concatenate([sess.run([name], f)[0] for f in feeds], axis=0)


def dynamic_cnn(path: Path, opset: int = 17) -> Path:
    """A tiny CNN whose input is ``[N, 3, H, W]`` with symbolic N, H and W."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "fw")]
    nodes = [helper.make_node("Conv", ["images", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fw"], ["logits"], name="head")]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                           ["N", 3, "H", "W"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    return path


def loaded_onnx(tmp_path_factory, data: bytes, name: str, shapes: dict):
    """(LoadedModel, inventory) of an ONNX given as bytes, written to a temp file (for estimate tests)."""
    from core.model.inventory import build_inventory
    from core.model.load import model_from_bytes

    path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
    path.write_bytes(data)
    model = model_from_bytes(data, path)
    return model, build_inventory(model, None, shapes)


@pytest.fixture(scope="session")
def resnet18_b32(tmp_path_factory):
    """ResNet-18 (tests.fixtures.nets, torchvision's layout) at batch 32 x 3 x 224 x 224, with its inventory."""
    from tests.fixtures.nets import resnet18_onnx

    return loaded_onnx(tmp_path_factory, resnet18_onnx(batch=32), "resnet18", {"input": (32, 3, 224, 224)})


# --- the dashboard in a real browser (tests/test_e2e_*.py): one server and one Chromium per session ---
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test (each test opens its own contexts: own cookies, own sessions)."""
    if not Path(CHROMIUM).exists():
        pytest.skip("apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class _Dashboard:
    """``streamlit run app.py`` on a free localhost port over its own workspace, its log in ``streamlit.log``
    there. Started in its own process group, so stopping it also stops its estimate and job children."""

    def __init__(self, root: Path):
        self.root = root
        self.proc = None
        self.url = ""

    def start(self) -> None:
        import os
        import socket
        import subprocess
        import time

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "MIXPREC_WORKSPACE": str(self.root), "MIXPREC_ESTIMATE_WAIT": "0.25"}
        repo = Path(__file__).resolve().parents[1]
        with open(self.root / "streamlit.log", "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", str(repo / "app.py"), "--server.port", str(port),
                 "--server.address", "localhost", "--server.headless", "true"],
                cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://localhost:{port}"
        deadline = time.monotonic() + 120
        while not self.healthy():
            assert self.proc.poll() is None and time.monotonic() < deadline, (self.root / "streamlit.log").read_text()
            time.sleep(0.3)  # polling the health endpoint until the server answers

    def healthy(self) -> bool:
        import urllib.request

        try:
            urllib.request.urlopen(self.url + "/_stcore/health", timeout=5)
            return True
        except OSError:
            return False

    def stop(self) -> None:
        import os
        import signal
        import subprocess

        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)


@pytest.fixture(scope="session")
def dashboard(tmp_path_factory, minilm_sample, tiny_cnn_sample, tiny_transformer_sample):
    """One dashboard for every browser test, over a workspace of its own (not the samples workspace, where the
    unit tests store rankings). The session's built samples are linked in, so the server never exports MiniLM
    again (the home page's default model)."""
    import shutil

    from core.workspace import Workspace

    root = tmp_path_factory.mktemp("e2e-ws")
    ws = Workspace(root)
    for paths in (minilm_sample, tiny_cnn_sample, tiny_transformer_sample):
        folder = Path(paths.model).parent
        shutil.copytree(folder, ws.samples / folder.name, copy_function=_link_or_copy)
    d = _Dashboard(root)
    d.start()
    yield d
    d.stop()


def _link_or_copy(src, dst):
    import os
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class Server(NamedTuple):
    """What a browser test gets: the dashboard's ``url``, its workspace ``ws`` and ``since``, the time the test
    started (``time.time()``): the jobs it started are those created since."""
    url: str
    ws: object
    since: float


@pytest.fixture
def server(dashboard):
    """The session's dashboard for one browser test (a server that died is started again)."""
    import time

    from core.workspace import Workspace

    if dashboard.proc.poll() is not None or not dashboard.healthy():
        dashboard.stop()
        dashboard.start()
    return Server(dashboard.url, Workspace(dashboard.root), time.time())
