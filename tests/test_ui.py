"""The Dagster UI end to end: `dagster dev` on the project's workspace, a materialization launched exactly as the UI's
Materialize button launches it (GraphQL), and the same through the real UI in headless Chromium.

One `dagster dev` (webserver + daemon + code server) serves both tests; it runs in its own session (process group)
so teardown can stop every process it started, with bounded waits.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cowork_pipeline.lake import Lake

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOT_COPY = Path("/tmp/cowork_ui_screenshot.png")
ASSET = "capability_specs"
CHECK = "capability_specs_quality"
ASSET_JOB = "__ASSET_JOB"  # the implicit job the UI's Materialize button targets
START_TIMEOUT_S = 180  # dagster dev: code server + webserver + daemon (about 30-40 s on 2 idle cores)
RUN_TIMEOUT_S = 180
STOP_TIMEOUT_S = 20
DAGSTER_YAML_FALLBACK = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
# Talk to the local server directly, even where HTTP(S)_PROXY is set (Chromium bypasses loopback by itself).
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))

# The UI's own documents (dagster-webserver 1.13: ui-core/src/assets/LaunchAssetExecutionButton.tsx, asInput.ts).
SET_NUX_SEEN = "mutation SetNuxSeen {\n  setNuxSeen\n}"
LAUNCH = """
mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { id pipelineName } }
    ... on PipelineNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on PythonError { message stack }
  }
}"""
ASSET_NODE = """
query LaunchAssetLoader($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys) {
    assetKey { path }
    groupName
    jobNames
    repository { name location { name } }
    assetChecksOrError { __typename ... on AssetChecks { checks { name jobNames blocking } } }
  }
}"""
RUN = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { id status pipelineName assetSelection { path } assetCheckSelection { name assetKey { path } } }
    ... on PythonError { message }
  }
}"""
RUN_IDS = """
query RunIds { runsOrError(limit: 100) { ... on Runs { results { id } } } }"""
CHECK_EXECUTIONS = """
query Checks($assetKey: AssetKeyInput!, $checkName: String!) {
  assetCheckExecutions(assetKey: $assetKey, checkName: $checkName, limit: 20) {
    runId
    status
    evaluation {
      success
      checkName
      description
      metadataEntries { label ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text } }
    }
  }
}"""
LOCATIONS = """
query Locations {
  workspaceOrError {
    __typename
    ... on Workspace { locationEntries { name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } }
  }
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DagsterDev:
    def __init__(self, base_url: str, lake_root: Path, log_path: Path):
        self.base_url = base_url
        self.lake_root = lake_root
        self.log_path = log_path

    def gql(self, query: str, variables: dict | None = None, timeout: float = 30) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        req = urllib.request.Request(f"{self.base_url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with _LOCAL.open(req, timeout=timeout) as resp:
            out = json.load(resp)
        assert not out.get("errors"), out["errors"]
        return out["data"]

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_for_run(self, run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            run = self.gql(RUN, {"runId": run_id})["runOrError"]
            assert run["__typename"] == "Run", run
            if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
                return run
            if time.monotonic() > deadline:
                pytest.fail(f"run {run_id} still {run['status']} after {timeout:.0f}s\n{self.log_tail()}")
            time.sleep(1)

    def run_ids(self) -> set[str]:
        return {r["id"] for r in self.gql(RUN_IDS)["runsOrError"]["results"]}


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the whole session (dagster dev, webserver, daemon, code servers, run workers), then SIGKILL."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (the leader may have exited first)
    except ProcessLookupError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory):
    try:
        from assets.run import DAGSTER_YAML
    except ImportError:  # pragma: no cover - keep the test independent of run.py's layout
        DAGSTER_YAML = DAGSTER_YAML_FALLBACK
    base = tmp_path_factory.mktemp("ui")
    home, lake = base / "dagster_home", base / "lake"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)  # what `cowork ui` / ensure_home writes
    port = _free_port()
    no_proxy = ",".join(filter(None, ["127.0.0.1", "localhost", os.environ.get("NO_PROXY", "")]))
    env = dict(os.environ, DAGSTER_HOME=str(home), COWORK_LAKE=str(lake), NO_PROXY=no_proxy, no_proxy=no_proxy)
    log_path = base / "dagster_dev.log"
    log = open(log_path, "w")
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)]
    # Own session, so teardown can signal the whole group. SIGINT back to default: dagster dev maps SIGTERM onto
    # the SIGINT handler, and a runner started in the background may hand down an *ignored* SIGINT.
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    server = DagsterDev(f"http://127.0.0.1:{port}", lake, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the webserver, then the code location
            if proc.poll() is not None:
                pytest.fail(f"dagster dev exited with {proc.returncode}\n{server.log_tail()}")
            try:
                with _LOCAL.open(f"{server.base_url}/server_info", timeout=5) as resp:
                    info = json.load(resp)
                entries = server.gql(LOCATIONS)["workspaceOrError"]["locationEntries"]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    errors = [e for e in entries if e["locationOrLoadError"]["__typename"] != "RepositoryLocation"]
                    assert not errors, errors
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, KeyError, TypeError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dagster dev not ready after {START_TIMEOUT_S}s\n{server.log_tail()}")
            time.sleep(1)
        assert info["dagster_version"].startswith("1.13"), info
        # Dismiss the first-visit modal the UI shows on localhost (what its "Get started" button does).
        assert server.gql(SET_NUX_SEEN)["setNuxSeen"] is True
        yield server
    finally:
        _stop(proc)
        log.close()


def _asset_node(server: DagsterDev) -> dict:
    nodes = server.gql(ASSET_NODE, {"assetKeys": [{"path": [ASSET]}]})["assetNodes"]
    assert len(nodes) == 1, nodes
    return nodes[0]


def _materialize_params(node: dict) -> dict:
    """executionParamsForAssetJob() of the UI, for one selected asset node."""
    checks = node["assetChecksOrError"]
    assert checks["__typename"] == "AssetChecks", checks
    return {
        "mode": "default",
        "executionMetadata": {"tags": []},
        "runConfigData": "{}",
        "selector": {
            "repositoryLocationName": node["repository"]["location"]["name"],
            "repositoryName": node["repository"]["name"],
            "pipelineName": ASSET_JOB,
            "assetSelection": [{"path": node["assetKey"]["path"]}],
            "assetCheckSelection": [{"name": c["name"], "assetKey": {"path": node["assetKey"]["path"]}}
                                    for c in checks["checks"] if not c["jobNames"] or ASSET_JOB in c["jobNames"]],
        },
    }


def _check_evaluation(server: DagsterDev, run_id: str) -> dict:
    executions = server.gql(CHECK_EXECUTIONS, {"assetKey": {"path": [ASSET]}, "checkName": CHECK})["assetCheckExecutions"]
    mine = [e for e in executions if e["runId"] == run_id]
    assert len(mine) == 1, executions
    assert mine[0]["status"] == "SUCCEEDED", mine[0]
    evaluation = mine[0]["evaluation"]
    assert evaluation["checkName"] == CHECK and evaluation["success"] is True, evaluation
    return {m["label"]: m.get("intValue", m.get("text")) for m in evaluation["metadataEntries"]}


def _assert_promoted_by(server: DagsterDev, run_id: str, delta_version: int) -> None:
    lake = Lake(server.lake_root)
    assert lake.exists(ASSET), f"no Delta table {ASSET} under {server.lake_root}"
    df, version = lake.read_promoted(ASSET)
    assert version == delta_version  # the version the check passed on is the one published
    assert len(df) > 0 and set(df["_run_id"]) == {run_id}
    assert run_id in {h["run_id"] for h in lake.history(ASSET)}


def test_graphql_materialize_like_the_ui_button(dagster_dev):
    server = dagster_dev
    assert server.gql("query { shouldShowNux }")["shouldShowNux"] is False
    node = _asset_node(server)
    assert ASSET_JOB in node["jobNames"]
    params = _materialize_params(node)
    assert params["selector"]["assetCheckSelection"] == [{"name": CHECK, "assetKey": {"path": [ASSET]}}]

    launched = server.gql(LAUNCH, {"executionParams": params})["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["id"]
    assert launched["run"]["pipelineName"] == ASSET_JOB

    run = server.wait_for_run(run_id)
    assert run["status"] == "SUCCESS", f"{run}\n{server.log_tail()}"
    assert run["assetSelection"] == [{"path": [ASSET]}]
    assert run["assetCheckSelection"] == [{"name": CHECK, "assetKey": {"path": [ASSET]}}]

    meta = _check_evaluation(server, run_id)
    assert meta["summary"].endswith("expectations passed"), meta
    _assert_promoted_by(server, run_id, meta["delta_version"])


def _screenshot_ok(path: Path) -> None:
    assert path.is_file(), path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert path.stat().st_size > 20_000, f"{path} is only {path.stat().st_size} bytes"
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return
    with Image.open(path) as im:
        assert im.size[0] >= 1000 and im.size[1] >= 700, im.size
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is None or len(colors) > 50, "screenshot is (nearly) blank"


def test_browser_materialize_button(dagster_dev, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (scripts/install_browser.sh) to run the browser test")
    from playwright import sync_api  # dev dependency; drives the system chromium, never a downloaded browser

    server = dagster_dev
    node = _asset_node(server)
    location, group = node["repository"]["location"]["name"], node["groupName"]
    before = server.run_ids()
    shots = tmp_path / "screenshots"
    shots.mkdir()

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(60_000)
            # The asset graph of the asset's group; the NUX modal was dismissed by the fixture (setNuxSeen).
            page.goto(f"{server.base_url}/locations/{location}/asset-groups/{group}", wait_until="domcontentloaded")
            asset_node = page.get_by_text(ASSET, exact=True).first
            asset_node.wait_for(state="visible")
            asset_node.click()  # selects the node (and opens its side panel)
            page.wait_for_url(f"**/{ASSET}*")
            button = page.get_by_role("button", name="Materialize selected")
            button.wait_for(state="visible")
            page.screenshot(path=str(shots / "1-selected.png"))
            button.click()

            deadline = time.monotonic() + 60
            while not (new := server.run_ids() - before):
                if time.monotonic() > deadline:
                    page.screenshot(path=str(shots / "no-run.png"))
                    pytest.fail(f"clicking Materialize launched no run (see {shots})\n{server.log_tail()}")
                time.sleep(0.5)
            assert len(new) == 1, new
            run_id = new.pop()
            run = server.wait_for_run(run_id)
            assert run["status"] == "SUCCESS", f"{run}\n{server.log_tail()}"
            # the button sent what test_graphql_materialize_like_the_ui_button sends
            assert run["pipelineName"] == ASSET_JOB
            assert run["assetSelection"] == [{"path": [ASSET]}]
            assert run["assetCheckSelection"] == [{"name": CHECK, "assetKey": {"path": [ASSET]}}]

            # the run page shows the success; the graph shows the fresh materialization and its passed check
            page.goto(f"{server.base_url}/runs/{run_id}", wait_until="domcontentloaded")
            page.get_by_text("Success", exact=True).first.wait_for(state="visible")
            page.get_by_text(f'Finished execution of run for "{ASSET_JOB}"').first.wait_for(state="visible")  # logs loaded
            page.screenshot(path=str(shots / "2-run.png"))
            page.goto(f"{server.base_url}/locations/{location}/asset-groups/{group}/lineage/{ASSET}",
                      wait_until="domcontentloaded")
            page.get_by_text(run_id[:8]).first.wait_for(state="visible")  # latest materialization = this run
            page.get_by_text("1 / 1 Passed").first.wait_for(state="visible")
            page.screenshot(path=str(shots / "3-graph.png"))
        finally:
            browser.close()

    meta = _check_evaluation(server, run_id)
    _assert_promoted_by(server, run_id, meta["delta_version"])
    for name in ("1-selected.png", "2-run.png", "3-graph.png"):
        _screenshot_ok(shots / name)
    shutil.copyfile(shots / "3-graph.png", SCREENSHOT_COPY)
    shutil.copyfile(shots / "2-run.png", SCREENSHOT_COPY.with_name("cowork_ui_run_screenshot.png"))
    _screenshot_ok(SCREENSHOT_COPY)
