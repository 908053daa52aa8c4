"""Lineage: trace any artifact id in the lake back to the capability spec and repair attempts behind it.

``trace(lake, any_id)`` returns a :class:`LineageNode` tree; ``node.render()`` draws it as an indented
text tree and ``node.to_dict()`` / ``node.to_json()`` give the same tree as JSON. Every node that comes
from a table row says which Delta version it was read at, whether that version is (still) the promoted
one, the Dagster run that wrote the row (``_run_id``), the code version and the upstream Delta versions
the writer read (``_upstream_versions``).

Id scheme
---------
An id may carry a kind prefix, or be given bare (then it is looked up, in this order, as a checkpoint id,
demo id, trajectory id, RL rollout id, environment id, repair attempt id, capability id)::

    score:<run_id>:<checkpoint_id>:<env_id>:<trial>   one benchmark trial (the canonical form printed in trees)
    score:<checkpoint_id>:<env_id>:<trial>            the same, in the promoted benchmark_scores
    score:<checkpoint_id>:<env_id>                    every trial of that checkpoint on that environment
    <env_id>@<checkpoint_id>                          the same as the line above (either order is accepted)
    ckpt:<checkpoint_id>                              a checkpoint (checkpoints, rl_checkpoints; teacher-embedded and endpoint-<name> too)
    rollout:<rollout_id>                              an RL rollout (rl_rollouts; absent table: a clear error)
    demo:<demo_id>                                    a demonstration (demo-...)
    traj:<traj_id>                                    a teacher trajectory (<env_id>:<teacher>:<seed>)
    env:<env_id>                                      a certified or rejected environment (<capability>-000123)
    attempt:<attempt_id>                              one draft / repair round (<capability>-s<seed>-a<round>)
    cap:<capability_id>                               a capability spec (and its partition's repair telemetry)

In a score id, ``<checkpoint_id>`` may also be the agent name (``sft:<checkpoint_id>``,
``teacher:embedded``); ``<run_id>`` selects the Delta version of ``benchmark_scores`` that run wrote
(time travel), so scores of superseded runs stay traceable.

How edges are followed
----------------------
Each hop reads the upstream table at the version the downstream row recorded, never "latest":
score --(``_upstream_versions``)--> checkpoint and environment; checkpoint --(``data_versions_json``)-->
``demonstrations@v`` (time travel) --> demonstration --> teacher trajectory --> environment --> capability
spec (the ``capability_specs`` version in the environment row's ``_upstream_versions``) and generator
(``generator`` of the spec JSON: backend, version, prompt version, attempt, model; plus the seed) and every
repair attempt (``repair_log`` + ``environment_drafts`` rows of the environment written by the same run).
An RL checkpoint (``rl_checkpoints``) leads to the ``rl_rollouts`` its own run wrote for its configuration; a
rollout leads to the checkpoint RL started from and to its environment. For per-partition promoted tables (the
synthesis tables) the row is read at the version its partition was published at as of the recorded version,
which is what the downstream reader saw (promotions are replayed up to that version; a rollback promoting an
older version in between is the one case this cannot tell apart).

Large fan-outs (a checkpoint's demonstrations, an RL checkpoint's rollouts) are summarised and the first
``max_items`` members are expanded (``max_items=0``: all). A node already shown elsewhere in the tree is
emitted again as a reference (``ref=True``) without children.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import polars as pl

from cowork_pipeline.lake import PROMOTIONS_TABLE, Lake, LakeError, Published, is_remote
from cowork_pipeline.spec import capability_of

__all__ = ["ID_FORMS", "LineageError", "LineageNode", "score_id", "trace", "trace_json", "transcript_summary"]

ID_FORMS = ("score:<run_id>:<checkpoint_id>:<env_id>:<trial>", "score:<checkpoint_id>:<env_id>[:<trial>]",
            "<env_id>@<checkpoint_id>", "ckpt:<checkpoint_id>", "rollout:<rollout_id>", "demo:<demo_id>",
            "traj:<traj_id>", "env:<env_id>", "attempt:<attempt_id>", "cap:<capability_id>")
TEACHER_CHECKPOINT = "teacher-embedded"
CHECKPOINT_TABLES = ("checkpoints", "rl_checkpoints")
SYNTH_TABLES = ("environment_drafts", "repair_log", "validated_environments", "rejected_environments", "repair_telemetry")
# Columns never worth reading for lineage (token ids of every RL message, raw model output).
HEAVY_COLUMNS = {"prompt_ids", "completion_ids", "logprobs", "advantage", "message_turn", "raw", "messages_json", "tools_json",
                 "mutants_json", "yaml"}
TEXT_HIDDEN = {"diagnostics_detail"}  # attrs only in JSON (the text tree shows their one-line form)
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$|^local-[0-9a-f]+$")


class LineageError(LookupError):
    """The id is unknown (or malformed); the message says where it was looked for and which forms exist."""


def score_id(run_id: str, checkpoint_id: str, env_id: str, trial: int) -> str:
    """The canonical id of one benchmark trial."""
    return f"score:{run_id}:{checkpoint_id}:{env_id}:{trial}"


# --------------------------------------------------------------------------------------------------- tree
@dataclass
class LineageNode:
    # score | checkpoint | dataset | demonstration | trajectory | rollout | environment | capability | generator | repair | attempt
    kind: str
    id: str
    title: str = ""
    table: str | None = None
    version: int | None = None  # the Delta version the row was read at
    promoted_version: int | None = None  # the version readers get today (for this row's partition)
    run_id: str | None = None  # the Dagster run that wrote the row (_run_id)
    code_version: str | None = None
    committed_at: str | None = None
    upstream_versions: dict[str, int] = field(default_factory=dict)  # what the writer read (_upstream_versions)
    attrs: dict[str, Any] = field(default_factory=dict)
    children: list["LineageNode"] = field(default_factory=list)
    ref: bool = False  # shown elsewhere in the tree; not expanded again
    notes: list[str] = field(default_factory=list)

    # ---- navigation
    def walk(self) -> Iterator["LineageNode"]:
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, kind: str) -> list["LineageNode"]:
        return [n for n in self.walk() if n.kind == kind]

    def run_ids(self) -> set[str]:
        return {n.run_id for n in self.walk() if n.run_id}

    # ---- output
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "id": self.id}
        if self.title:
            out["title"] = self.title
        if self.ref:
            out["ref"] = True
            return out
        if self.table is not None:
            out["table"] = self.table
            out["version"] = self.version
            out["promoted_version"] = self.promoted_version
            out["run_id"] = self.run_id
            out["code_version"] = self.code_version
            out["committed_at"] = self.committed_at
            out["upstream_versions"] = dict(self.upstream_versions)
        out["attrs"] = _jsonable(self.attrs)
        if self.notes:
            out["notes"] = list(self.notes)
        out["children"] = [c.to_dict() for c in self.children]
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, default=str)

    def headline(self) -> str:
        text = f"{self.kind} {self.id}"
        if self.title:
            text += f" — {self.title}"
        return text + ("  (shown above)" if self.ref else "")

    def detail_lines(self) -> list[str]:
        if self.ref:
            return []
        lines = []
        if self.table is not None:
            where = f"{self.table}@{self.version}"
            if self.promoted_version is None:
                where += " (never promoted)"
            elif self.promoted_version == self.version:
                where += " (promoted)"
            else:
                where += f" (time travel; promoted now @{self.promoted_version})"
            bits = [where, f"run {self.run_id}" if self.run_id else "run ?"]
            if self.code_version:
                bits.append(f"code {self.code_version}")
            if self.committed_at:
                bits.append(f"at {self.committed_at[:19]}")
            lines.append(" · ".join(bits))
            if self.upstream_versions:
                lines.append("read: " + ", ".join(f"{t}@{v}" for t, v in sorted(self.upstream_versions.items())))
        for k, v in self.attrs.items():
            if k in TEXT_HIDDEN:
                continue
            if isinstance(v, list) and v and (isinstance(v[0], (dict, list))
                                              or any(isinstance(x, str) and len(x) > 40 for x in v)):
                lines.append(f"{k}:")
                lines.extend(f"  - {_short(x, 200)}" for x in v)
            else:
                lines.append(f"{k}: {_short(v, 400)}")
        lines.extend(f"note: {n}" for n in self.notes)
        return lines

    def render(self) -> str:
        out: list[str] = []

        def rec(node: LineageNode, prefix: str, last: bool, root: bool) -> None:
            out.append(prefix + ("" if root else ("└── " if last else "├── ")) + node.headline())
            child_prefix = prefix if root else prefix + ("    " if last else "│   ")
            detail_prefix = child_prefix + ("│   " if node.children else "    ")
            out.extend((detail_prefix + d).rstrip() for d in node.detail_lines())
            for i, c in enumerate(node.children):
                rec(c, child_prefix, i == len(node.children) - 1, False)

        rec(self, "", True, True)
        return "\n".join(out)


def _short(v: Any, limit: int = 160) -> str:
    if isinstance(v, dict):
        text = ", ".join(f"{k}={_short(x, 120)}" for k, x in v.items())
    elif isinstance(v, (list, tuple)):
        text = "[" + ", ".join(_short(x, 60) for x in v) + "]"
    else:
        text = str(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _loads(text: Any, default: Any) -> Any:
    if not isinstance(text, str) or not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


# ---------------------------------------------------------------------------------------------- the lake
@dataclass
class _Row:
    table: str
    version: int
    row: dict[str, Any]


class _Tracer:
    """Cached, version-exact reads of the lake, and one builder per node kind."""

    def __init__(self, lake: Lake, max_items: int = 3):
        self.lake = lake
        self.max_items = max_items
        self._frames: dict[tuple[str, int], pl.DataFrame | None] = {}
        self._latest: dict[str, int | None] = {}
        self._history: dict[str, list[dict[str, Any]]] = {}
        self._promotions: pl.DataFrame | None = None
        self._seen: set[tuple[str, str, str | None, int | None]] = set()

    # ---- raw access
    def latest(self, table: str) -> int | None:
        if table not in self._latest:
            try:
                self._latest[table] = self.lake.version(table)
            except LakeError:
                self._latest[table] = None
        return self._latest[table]

    def frame(self, table: str, version: int | None = None) -> pl.DataFrame | None:
        """The table at ``version`` (latest when None) without heavy columns; None when it does not exist."""
        if version is None:
            version = self.latest(table)
            if version is None:
                return None
        key = (table, version)
        if key not in self._frames:
            try:
                from deltalake import DeltaTable

                dt = DeltaTable(self.lake.uri(table), version=version, storage_options=self.lake.storage_options)
                names = dt.schema().to_arrow().names
                self._frames[key] = self.lake.read(table, version=version, columns=[c for c in names if c not in HEAVY_COLUMNS])
            except Exception:  # noqa: BLE001 - a missing / unreadable table is "not found" for lineage
                self._frames[key] = None
        return self._frames[key]

    def full_row(self, table: str, version: int, column: str, value: Any, wanted: tuple[str, ...]) -> dict[str, Any]:
        """Heavy columns (e.g. ``spec_json``/``yaml``) of one row, read only when a node needs them."""
        try:
            df = self.lake.read(table, version=version, columns=[column, *wanted],
                                where={column: [value]} if isinstance(value, str) else None)
        except LakeError:
            return {}
        hit = df.filter(pl.col(column) == value)
        return hit.row(0, named=True) if len(hit) else {}

    def transcript(self, version: int, trial: dict[str, Any]) -> str | None:
        """A benchmark trial's ``messages_json`` (heavy: read for the one trial a node shows)."""
        keys = [k for k in ("run_id", "agent", "checkpoint_id", "env_id", "trial") if trial.get(k) is not None]
        try:
            df = self.lake.read("benchmark_scores", version=version, columns=[*keys, "messages_json"],
                                where={"env_id": [trial["env_id"]]} if isinstance(trial.get("env_id"), str) else None)
        except Exception:  # noqa: BLE001 - a missing table, or one written before transcripts were kept
            return None
        hit = df.filter(pl.all_horizontal([pl.col(k) == trial[k] for k in keys]))
        return hit["messages_json"][0] if len(hit) else None

    def history(self, table: str) -> list[dict[str, Any]]:
        if table not in self._history:
            try:
                self._history[table] = self.lake.history(table, limit=None)
            except LakeError:
                self._history[table] = []
        return self._history[table]

    def committed_at(self, table: str, version: int | None) -> str | None:
        return next((h["timestamp"] for h in self.history(table) if h["version"] == version), None)

    def version_by_run(self, table: str, run_id: str | None) -> int | None:
        """The newest version of ``table`` committed by ``run_id`` (commit metadata), or None."""
        if not run_id:
            return None
        return next((h["version"] for h in self.history(table) if h.get("run_id") == run_id and h.get("version") is not None), None)

    def promotions(self, table: str) -> pl.DataFrame:
        if self._promotions is None:
            try:
                self._promotions = self.lake.promotions()
            except LakeError:
                self._promotions = pl.DataFrame()
        if self._promotions.is_empty():
            return self._promotions
        return self._promotions.filter(pl.col("table") == table)

    def published(self, table: str, as_of: int | None = None, partition: str | None = None) -> int | None:
        """The version readers got for ``partition`` of ``table``: today, or as of a reader that recorded
        version ``as_of`` (replaying only promotions of versions <= as_of). None: never promoted."""
        return Published.replay(self.promotions(table), as_of).version(partition)

    # ---- lookups
    def lookup(self, table: str, column: str, value: Any, version: int | None = None,
               partition: str | None = None) -> _Row | None:
        """The row with ``column == value``: at ``version`` (for partitioned tables: at the version its
        partition was published as of ``version``), else in today's promoted data, else in the latest version."""
        candidates: list[int] = []
        if version is not None:
            v = self.published(table, as_of=version, partition=partition) if table in SYNTH_TABLES else None
            candidates += [x for x in (v, version) if x is not None]
        else:
            if partition is not None or table not in SYNTH_TABLES:
                v = self.published(table, partition=partition)
                if v is not None:
                    candidates.append(v)
            else:  # a partitioned table, partition unknown: every partition's published version, newest first
                promos = self.promotions(table)
                candidates += sorted({int(x) for x in promos["version"].to_list()} if len(promos) else set(), reverse=True)
            latest = self.latest(table)
            if latest is not None:
                candidates.append(latest)
        for v in dict.fromkeys(candidates):
            df = self.frame(table, v)
            if df is None or column not in df.columns:
                continue
            hit = df.filter(pl.col(column) == value)
            if len(hit):
                return _Row(table, v, hit.row(0, named=True))
        return None

    def lookup_any_version(self, table: str, column: str, value: Any) -> _Row | None:
        """Promoted, latest, then older versions newest first (ids of superseded full-table writes)."""
        hit = self.lookup(table, column, value)
        if hit is not None:
            return hit
        latest = self.latest(table)
        for v in range((latest or 0) - 1, -1, -1) if latest is not None else ():
            df = self.frame(table, v)
            if df is not None and column in df.columns:
                rows = df.filter(pl.col(column) == value)
                if len(rows):
                    return _Row(table, v, rows.row(0, named=True))
        return None

    # ---- node helpers
    def node(self, kind: str, id_: str, hit: _Row | None, title: str = "", partition: str | None = None) -> LineageNode:
        n = LineageNode(kind, id_, title)
        if hit is not None:
            r = hit.row
            n.table, n.version = hit.table, hit.version
            n.promoted_version = self.published(hit.table, partition=partition)
            n.run_id, n.code_version = r.get("_run_id"), r.get("_code_version")
            n.committed_at = self.committed_at(hit.table, hit.version)
            n.upstream_versions = {k: int(v) for k, v in _loads(r.get("_upstream_versions"), {}).items()}
        return n

    def seen(self, kind: str, id_: str, table: str | None, version: int | None) -> bool:
        key = (kind, id_, table, version)
        if key in self._seen:
            return True
        self._seen.add(key)
        return False

    def settled(self, kind: str, id_: str, hit: _Row | None, missing: str, why: str) -> LineageNode | None:
        """The node that ends a branch: a 'not found' node (with ``why``) when there is no row, a reference to the
        node already printed when this row was seen before; None when the caller must expand the row."""
        if hit is None:
            n = LineageNode(kind, id_, missing)
            n.notes.append(why)
            return n
        if self.seen(kind, id_, hit.table, hit.version):
            return LineageNode(kind, id_, ref=True)
        return None

    def expand_limit(self, items: list[Any]) -> tuple[list[Any], int]:
        if self.max_items and len(items) > self.max_items:
            return items[: self.max_items], len(items) - self.max_items
        return items, 0

    # ------------------------------------------------------------------------------------ builders
    def score(self, rows: pl.DataFrame, version: int) -> LineageNode:
        first = rows.row(0, named=True)
        ckpt, env_id = first["checkpoint_id"], first["env_id"]
        run = first.get("run_id") or first.get("_run_id")
        hit = _Row("benchmark_scores", version, first)
        trials = rows.sort("trial").to_dicts()
        if len(trials) == 1:
            t = trials[0]
            n = self.node("score", score_id(run, ckpt, env_id, t["trial"]), hit, f"{t['agent']} on {env_id}, trial {t['trial']}")
            n.attrs = {k: t.get(k) for k in ("agent", "checkpoint_id", "env_id", "capability_id", "split", "trial", "faulted",
                                             "score", "passed", "completion", "safety", "robustness", "failed_items", "termination",
                                             "n_tool_calls", "termination_detail") if k in t and t.get(k) not in (None, "")}
            n.attrs.update(transcript_summary(self.transcript(version, t)))
        else:
            n = self.node("score", f"score:{run}:{ckpt}:{env_id}", hit, f"{first['agent']} on {env_id}, {len(trials)} trials")
            n.attrs = {"agent": first["agent"], "checkpoint_id": ckpt, "env_id": env_id, "split": first.get("split"),
                       "mean_score": round(sum(t["score"] for t in trials) / len(trials), 4),
                       "trials": [{"trial": t["trial"], "score": t["score"], "passed": t["passed"], "faulted": t.get("faulted"),
                                   "id": score_id(run, ckpt, env_id, t["trial"])} for t in trials]}
        up = n.upstream_versions
        n.children.append(self.checkpoint(ckpt, {t: up[t] for t in CHECKPOINT_TABLES if t in up}, agent=_loads(first.get("agent_json"), {})))
        n.children.append(self.environment(env_id, up.get("validated_environments"), split=first.get("split"),
                                           capability=first.get("capability_id")))
        return n

    def find_checkpoint(self, ckpt: str, versions: dict[str, int] | None = None) -> _Row | None:
        """A checkpoint row: at the recorded version of ``checkpoints`` / ``rl_checkpoints``, else promoted / latest."""
        versions = versions or {}
        for table in CHECKPOINT_TABLES:
            if versions.get(table) is not None:
                hit = self.lookup(table, "checkpoint_id", ckpt, versions[table])
                if hit is not None:
                    return hit
        for table in CHECKPOINT_TABLES:
            hit = self.lookup(table, "checkpoint_id", ckpt)
            if hit is not None:
                return hit
        return None

    def checkpoint(self, ckpt: str, versions: dict[str, int] | None = None, agent: dict[str, Any] | None = None) -> LineageNode:
        """``agent``: what the score row recorded about the agent (an endpoint's model and URL: the lake has no other row for it)."""
        if ckpt == TEACHER_CHECKPOINT or ckpt.startswith("teacher"):
            n = LineageNode("checkpoint", ckpt, "the embedded teacher (no weights)")
            n.attrs = {"kind": "teacher", "policy": "each environment's certified reference program, executed as an agent",
                       "training_data": "none"}
            return n
        if ckpt.startswith("endpoint-"):
            n = LineageNode("checkpoint", ckpt, "a model behind an OpenAI-compatible endpoint (no weights in the lake)")
            n.attrs = {"kind": "endpoint", "policy": "an external model, scored through the same runner and graders",
                       "training_data": "unknown to the lake",
                       **{k: v for k, v in (agent or {}).items() if k in ("model", "base_url", "temperature", "max_tokens") and v is not None}}
            return n
        hit = self.find_checkpoint(ckpt, versions)
        end = self.settled("checkpoint", ckpt, hit, "not in the checkpoint tables",
                           f"neither {' nor '.join(CHECKPOINT_TABLES)} has a row for this id (external or deleted checkpoint)")
        if end is not None:
            return end
        r = hit.row
        n = self.node("checkpoint", ckpt, hit, f"{r.get('kind')} checkpoint")
        data_versions = {k: int(v) for k, v in _loads(r.get("data_versions_json"), {}).items()}
        metrics = _loads(r.get("metrics_json"), {})
        config = _loads(r.get("config_json"), {})
        n.attrs = {"kind": r.get("kind"), "path": r.get("path"), "base_model": r.get("base_model"),
                   "base_checkpoint_id": r.get("base_checkpoint_id"), "device": r.get("device"), "data_versions": data_versions}
        if r.get("path") and not is_remote(str(r["path"])):  # `cowork vacuum` deletes superseded weights; the row stays
            n.attrs["weights_on_disk"] = Path(str(r["path"])).exists()
        elif r.get("path"):
            from cowork_pipeline.training.model_store import ModelStoreError, remote_manifest

            try:
                n.attrs["weights_in_store"] = remote_manifest(str(r["path"]), self.lake.storage_options) is not None
            except (ModelStoreError, OSError) as e:
                n.attrs["weights_in_store"] = f"unknown ({e})"
        if metrics:
            keep = ("first_loss", "last_loss", "steps", "train_tokens", "mean_reward", "pass_rate", "step", "lora")
            n.attrs["metrics"] = {k: v for k, v in metrics.items() if k in keep} or metrics
        for table, v in sorted(data_versions.items()):
            if table not in CHECKPOINT_TABLES:
                n.children.append(self.dataset(table, v))
        if r.get("kind") == "rl":
            # An RL checkpoint is trained on the rollouts its own run wrote for its configuration.
            name = config.get("name") or (ckpt.split("-")[1] if ckpt.startswith("rl-") else None)
            v = self.version_by_run("rl_rollouts", r.get("_run_id"))
            if v is not None:
                n.children.insert(0, self.dataset("rl_rollouts", v, where=("config", name) if name else None))
            else:
                n.notes.append("no rl_rollouts version written by this checkpoint's run")
        if r.get("base_checkpoint_id"):
            base_versions = ({"checkpoints": data_versions["checkpoints"]} if "checkpoints" in data_versions
                             else {hit.table: hit.version})
            n.children.append(self.checkpoint(r["base_checkpoint_id"], base_versions))
        return n

    def dataset(self, table: str, version: int, where: tuple[str, Any] | None = None) -> LineageNode:
        """A whole table version a model was trained on (optionally the rows with ``column == value``): a summary,
        plus the first ``max_items`` members expanded for tables whose rows have lineage of their own."""
        df = self.frame(table, version)
        nid = f"{table}@{version}" + (f"[{where[0]}={where[1]}]" if where else "")
        n = LineageNode("dataset", nid, f"{table} at Delta version {version}")
        if df is None:
            n.notes.append(f"{table}@{version} is not in the lake (missing table or vacuumed version)")
            return n
        if self.seen("dataset", nid, table, version):
            return LineageNode("dataset", nid, ref=True)
        if where is not None and where[0] in df.columns:
            df = df.filter(pl.col(where[0]) == where[1])
        n.table, n.version = table, version
        n.promoted_version = self.published(table)
        n.committed_at = self.committed_at(table, version)
        runs = sorted(set(df["_run_id"].drop_nulls().to_list())) if "_run_id" in df.columns else []
        n.run_id = runs[0] if len(runs) == 1 else None
        n.code_version = df["_code_version"][0] if "_code_version" in df.columns and len(df) else None
        ups = sorted(set(df["_upstream_versions"].drop_nulls().to_list())) if "_upstream_versions" in df.columns else []
        if len(ups) == 1:
            n.upstream_versions = {k: int(v) for k, v in _loads(ups[0], {}).items()}
        n.attrs = {"rows": len(df)}
        if len(runs) > 1:
            n.attrs["run_ids"] = runs
        if "capability_id" in df.columns:
            n.attrs["by_capability"] = dict(df.group_by("capability_id").len().sort("capability_id").iter_rows())
        id_col = {"demonstrations": "demo_id", "rl_rollouts": "rollout_id", "teacher_trajectories": "traj_id"}.get(table)
        if id_col and id_col in df.columns:
            ids = sorted(df[id_col].to_list())
            shown, more = self.expand_limit(ids)
            build = {"demonstrations": self.demonstration, "rl_rollouts": self.rollout, "teacher_trajectories": self.trajectory}[table]
            for i in shown:
                n.children.append(build(_Row(table, version, df.filter(pl.col(id_col) == i).row(0, named=True))))
            if more:
                n.notes.append(f"{more} more {table} rows not expanded (max_items={self.max_items}; 0 expands all)")
        return n

    def demonstration(self, hit: _Row) -> LineageNode:
        r = hit.row
        if self.seen("demonstration", r["demo_id"], hit.table, hit.version):
            return LineageNode("demonstration", r["demo_id"], ref=True)
        n = self.node("demonstration", r["demo_id"], hit, f"{r.get('capability_id')} / {r.get('env_id')}")
        n.attrs = {k: r.get(k) for k in ("traj_id", "env_id", "capability_id", "split", "multi_turn", "n_chars", "n_assistant_turns")}
        t = self.lookup("teacher_trajectories", "traj_id", r["traj_id"], n.upstream_versions.get("teacher_trajectories"))
        if t is None:
            n.children.append(LineageNode("trajectory", r["traj_id"], "not found in teacher_trajectories"))
            n.children.append(self.environment(r["env_id"], None, split=r.get("split"), capability=r.get("capability_id")))
        else:
            n.children.append(self.trajectory(t))
        return n

    def trajectory(self, hit: _Row) -> LineageNode:
        r = hit.row
        if self.seen("trajectory", r["traj_id"], hit.table, hit.version):
            return LineageNode("trajectory", r["traj_id"], ref=True)
        n = self.node("trajectory", r["traj_id"], hit, f"{r.get('teacher')} on {r.get('env_id')}")
        n.attrs = {k: r.get(k) for k in ("env_id", "capability_id", "split", "teacher", "passed", "completion", "safety",
                                         "termination", "n_tool_calls", "faults_injected", "fault_rate", "env_spec_hash")}
        env = self.environment(r["env_id"], n.upstream_versions.get("validated_environments"), split=r.get("split"),
                               capability=r.get("capability_id"))
        if env.attrs.get("spec_hash") and r.get("env_spec_hash"):
            n.attrs["spec_hash_matches_environment"] = env.attrs["spec_hash"] == r["env_spec_hash"]
        n.children.append(env)
        return n

    def rollout(self, hit: _Row) -> LineageNode:
        r = hit.row
        if self.seen("rollout", r["rollout_id"], hit.table, hit.version):
            return LineageNode("rollout", r["rollout_id"], ref=True)
        n = self.node("rollout", r["rollout_id"], hit, f"RL config {r.get('config')}, step {r.get('step')}")
        n.attrs = {k: r.get(k) for k in ("config", "step", "group", "env_id", "reward", "passed", "completion", "safety",
                                         "termination", "n_messages", "turn_rewards") if k in r}
        up = n.upstream_versions
        # The policy that sampled it: the starting checkpoint of the RL checkpoint the same run trained for this config.
        start = next((r[c] for c in ("checkpoint_id", "policy_checkpoint_id") if r.get(c)), None)
        v_rl = self.version_by_run("rl_checkpoints", r.get("_run_id"))
        df = self.frame("rl_checkpoints", v_rl) if v_rl is not None else None
        if df is not None and "checkpoint_id" in df.columns:
            mine = df.filter(pl.col("_run_id") == r.get("_run_id"))
            mine = mine.filter(pl.col("checkpoint_id").str.starts_with(f"rl-{r.get('config')}-")) if r.get("config") else mine
            if len(mine):
                n.attrs["trained_checkpoint"] = mine["checkpoint_id"][0]
                start = start or mine["base_checkpoint_id"][0]
        if start:
            n.children.append(self.checkpoint(start, {"checkpoints": up["checkpoints"]} if "checkpoints" in up else None))
        if r.get("env_id"):
            n.children.append(self.environment(r["env_id"], up.get("validated_environments")))
        return n

    def environment(self, env_id: str, version: int | None, *, split: str | None = None,
                    capability: str | None = None, run_id: str | None = None) -> LineageNode:
        cap_guess = capability or capability_of(env_id)
        hit = None
        if run_id:
            v = self.version_by_run("validated_environments", run_id)
            hit = self.lookup("validated_environments", "env_id", env_id, v) if v is not None else None
        if hit is None:
            hit = self.lookup("validated_environments", "env_id", env_id, version, partition=cap_guess)
        status = "certified"
        if hit is None:
            status = "rejected"
            v = self.version_by_run("rejected_environments", run_id)
            hit = self.lookup("rejected_environments", "env_id", env_id, v) if v is not None else None
            if hit is None:
                hit = self.lookup("rejected_environments", "env_id", env_id, version, partition=cap_guess)
        end = self.settled("environment", env_id, hit, "not found in validated_environments or rejected_environments",
                           "the synthesis tables have no row for this environment (table missing or rows replaced)")
        if end is not None:
            return end
        r = hit.row
        cap_id = r.get("capability_id") or cap_guess
        n = self.node("environment", env_id, hit, r.get("title") or f"{status} environment", partition=cap_id)
        if status == "certified":
            n.attrs = {"status": "certified", **{k: r.get(k) for k in (
                "capability_id", "seed", "multi_turn", "n_turns", "n_items", "rounds", "spec_hash", "capability_fingerprint",
                "difficulty", "difficulty_bucket", "mutants", "kill_rate", "reference_pass", "null_pass", "fault_pass", "equivalent_pass",
                "deterministic", "validator_version", "final_attempt_id")}}
        else:
            n.attrs = {"status": "rejected", **{k: r.get(k) for k in ("capability_id", "seed", "rounds", "codes", "reasons",
                                                                     "final_attempt_id")}}
        if split is None:
            sp = self.lookup("environment_splits", "env_id", env_id)
            split = sp.row.get("split") if sp else None
        if split is not None:
            n.attrs["split"] = split
        # capability spec, at the version this environment's synthesis read
        n.children.append(self.capability(cap_id, n.upstream_versions.get("capability_specs"),
                                          expect_fingerprint=r.get("capability_fingerprint")))
        # generator, from the spec JSON
        spec_col = "spec_json" if status == "certified" else "last_spec_json"
        spec = _loads(self.full_row(hit.table, hit.version, "env_id", env_id, (spec_col,)).get(spec_col), {})
        gen = dict(spec.get("generator") or {})
        g = LineageNode("generator", f"{gen.get('backend', r.get('generator_backend', '?'))}/"
                                     f"{gen.get('version', r.get('generator_version', '?'))}", "how the final spec was drafted")
        g.attrs = {"backend": gen.get("backend", r.get("generator_backend")),
                   "version": gen.get("version", r.get("generator_version")),
                   "prompt_version": gen.get("prompt_version"), "model": gen.get("model"), "attempt": gen.get("attempt"),
                   "seed": r.get("seed")}
        if not spec:
            g.notes.append("no spec JSON (the generator's output never parsed)")
        n.children.append(g)
        n.children.append(self.repair(env_id, cap_id, n.run_id, n.version, r.get("final_attempt_id")))
        return n

    def capability(self, cap_id: str, version: int | None, expect_fingerprint: str | None = None) -> LineageNode:
        hit = self.lookup("capability_specs", "capability_id", cap_id, version)
        end = self.settled("capability", cap_id, hit, "not found in capability_specs",
                           f"capability_specs{'@' + str(version) if version is not None else ''} has no row for it")
        if end is not None:
            return end
        r = hit.row
        n = self.node("capability", cap_id, hit, r.get("title") or "")
        n.attrs = {k: r.get(k) for k in ("fingerprint", "composer", "multi_turn", "heldout", "services", "tools")}
        if expect_fingerprint is not None:
            n.attrs["fingerprint_matches_environment"] = expect_fingerprint == r.get("fingerprint")
        if version is not None and hit.version != version:
            n.notes.append(f"read at {hit.version}: capability_specs@{version} (recorded upstream) has no row for it")
        return n

    def repair(self, env_id: str, cap_id: str, run_id: str | None, env_version: int | None,
               final_attempt: str | None) -> LineageNode:
        """Every draft / repair round of ``env_id``, from the repair_log the same run wrote."""
        g = LineageNode("repair", env_id, "draft and repair attempts")
        v = self.version_by_run("repair_log", run_id)
        rows = None
        if v is not None:
            df = self.frame("repair_log", v)
            rows = df.filter(pl.col("env_id") == env_id) if df is not None else None
        if rows is None or rows.is_empty():
            hit_v = self.published("repair_log", as_of=env_version, partition=cap_id) if env_version is not None else None
            v = hit_v if hit_v is not None else self.published("repair_log", partition=cap_id)
            df = self.frame("repair_log", v) if v is not None else None
            rows = df.filter(pl.col("env_id") == env_id) if df is not None else None
        if rows is None or rows.is_empty():
            g.notes.append("no repair_log rows for this environment")
            return g
        drafts_v = self.version_by_run("environment_drafts", run_id)
        drafts = self.frame("environment_drafts", drafts_v) if drafts_v is not None else None
        rows = rows.sort("round")
        g.attrs = {"rounds": len(rows), "final_attempt_id": final_attempt,
                   "certified": bool(rows["certified"][-1]) if "certified" in rows.columns else None}
        for r in rows.iter_rows(named=True):
            g.children.append(self.attempt(_Row("repair_log", v, r), cap_id, final_attempt, drafts, drafts_v))
        return g

    def attempt(self, hit: _Row, cap_id: str | None, final_attempt: str | None = None, drafts: pl.DataFrame | None = None,
                drafts_v: int | None = None) -> LineageNode:
        """One draft / repair round: the repair_log row (verdict, diagnostics, changes) and its environment_drafts row."""
        r = hit.row
        title = f"round {r.get('round')}: " + ("certified" if r.get("certified") else "failed " + ", ".join(r.get("codes") or []))
        if self.seen("attempt", r["attempt_id"], hit.table, hit.version):
            return LineageNode("attempt", r["attempt_id"], title, ref=True)
        a = self.node("attempt", r["attempt_id"], hit, title, partition=cap_id)
        diags = _loads(r.get("diagnostics_json"), [])
        a.attrs = {"env_id": r.get("env_id"), "round": r.get("round"), "certified": r.get("certified"), "backend": r.get("backend"),
                   "codes": list(r.get("codes") or []), "diagnostics": [f"{d.get('code')}: {d.get('message')}" for d in diags],
                   "changes": list(r.get("changes") or []), "kill_rate": r.get("kill_rate"), "seconds": r.get("seconds"),
                   "llm_tokens": r.get("llm_tokens")}
        if final_attempt is not None:
            a.attrs["final"] = r["attempt_id"] == final_attempt
        a.attrs["diagnostics_detail"] = diags  # the full dicts (JSON only; the text tree shows "code: message")
        if drafts is None:
            drafts_v = self.version_by_run("environment_drafts", r.get("_run_id"))
            drafts = self.frame("environment_drafts", drafts_v) if drafts_v is not None else None
        if drafts is not None and "attempt_id" in drafts.columns:
            d = drafts.filter(pl.col("attempt_id") == r["attempt_id"])
            if len(d):
                dr = d.row(0, named=True)
                a.attrs["draft"] = {"table": f"environment_drafts@{drafts_v}", "spec_hash": dr.get("spec_hash"),
                                    "generator_version": dr.get("generator_version"), "run_id": dr.get("_run_id")}
                try:
                    knobs = json.loads(dr.get("knobs_json") or "{}")  # absent in lakes written before it existed
                except ValueError:
                    knobs = {}
                if isinstance(knobs, dict) and knobs.get("prompt_sha256"):  # a model's draft: which prompt, which model
                    a.attrs["draft"].update({k: knobs.get(k) for k in ("model", "prompt_version", "prompt_sha256", "template_sha256",
                                                                        "cache_hit")})
        return a


# ----------------------------------------------------------------------------------------- resolution
def _score_rows(t: _Tracer, rest: str) -> tuple[pl.DataFrame, int] | None:
    """Parse ``[<run_id>:]<checkpoint_id|agent>:<env_id>[:<trial>]`` and return the matching score rows."""
    parts = rest.split(":")
    trial: int | None = None
    if len(parts) >= 3 and parts[-1].isdigit():
        trial = int(parts.pop())
    if len(parts) < 2:
        return None
    env_id = parts.pop()
    run_id = parts.pop(0) if len(parts) > 1 and _UUID.match(parts[0]) else None
    who = ":".join(parts)
    return _find_scores(t, who, env_id, trial, run_id)


def _find_scores(t: _Tracer, who: str, env_id: str, trial: int | None, run_id: str | None) -> tuple[pl.DataFrame, int] | None:
    versions: list[int] = []
    if run_id:
        v = t.version_by_run("benchmark_scores", run_id)
        if v is None:
            return None
        versions = [v]
    else:
        versions = [v for v in (t.published("benchmark_scores"), t.latest("benchmark_scores")) if v is not None]
    for v in dict.fromkeys(versions):
        df = t.frame("benchmark_scores", v)
        if df is None:
            continue
        rows = df.filter((pl.col("env_id") == env_id) & ((pl.col("checkpoint_id") == who) | (pl.col("agent") == who)))
        if run_id and "run_id" in rows.columns:
            rows = rows.filter(pl.col("run_id") == run_id)
        if trial is not None:
            rows = rows.filter(pl.col("trial") == trial)
        if len(rows):
            return rows, v
    return None


_LOOKUPS = (  # (kind, table, column) for bare ids, in resolution order
    ("checkpoint", "checkpoints", "checkpoint_id"),
    ("checkpoint", "rl_checkpoints", "checkpoint_id"),
    ("demonstration", "demonstrations", "demo_id"),
    ("trajectory", "teacher_trajectories", "traj_id"),
    ("rollout", "rl_rollouts", "rollout_id"),
    ("environment", "validated_environments", "env_id"),
    ("environment", "rejected_environments", "env_id"),
    ("attempt", "repair_log", "attempt_id"),
    ("attempt", "environment_drafts", "attempt_id"),
    ("capability", "capability_specs", "capability_id"),
)
_PREFIXES = {"ckpt": "checkpoint", "checkpoint": "checkpoint", "rollout": "rollout", "demo": "demonstration",
             "traj": "trajectory", "env": "environment", "attempt": "attempt", "cap": "capability", "capability": "capability"}


def _build(t: _Tracer, kind: str, table: str, key: str) -> LineageNode | None:
    if kind == "checkpoint":
        if key == TEACHER_CHECKPOINT:
            return t.checkpoint(key)
        hit = t.lookup(table, "checkpoint_id", key)
        return t.checkpoint(key, {table: hit.version}) if hit else None
    if kind == "demonstration":
        hit = t.lookup_any_version("demonstrations", "demo_id", key)
        return t.demonstration(hit) if hit else None
    if kind == "trajectory":
        hit = t.lookup_any_version("teacher_trajectories", "traj_id", key)
        return t.trajectory(hit) if hit else None
    if kind == "rollout":
        hit = t.lookup_any_version("rl_rollouts", "rollout_id", key)
        return t.rollout(hit) if hit else None
    if kind == "environment":
        if t.lookup(table, "env_id", key, partition=capability_of(key)) is None and t.lookup(table, "env_id", key) is None:
            return None
        return t.environment(key, None)
    if kind == "attempt":
        cap = capability_of(key)
        hit = t.lookup("repair_log", "attempt_id", key, partition=cap) or t.lookup("repair_log", "attempt_id", key)
        if hit is None:  # only a draft (e.g. the attempt's repair_log partition was replaced): read environment_drafts
            d = t.lookup(table, "attempt_id", key, partition=cap) or t.lookup(table, "attempt_id", key)
            if d is None:
                return None
            node = t.node("attempt", key, d, f"round {d.row.get('round')} (draft only)", partition=d.row.get("capability_id"))
            node.attrs = {k: d.row.get(k) for k in ("env_id", "capability_id", "seed", "round", "backend", "generator_version",
                                                    "spec_hash")}
            r = d.row
        else:
            r = hit.row
            node = t.attempt(hit, r.get("capability_id"))
        node.children.append(t.environment(r["env_id"], None, capability=r.get("capability_id"), run_id=r.get("_run_id")))
        return node
    if kind == "capability":
        if t.lookup("capability_specs", "capability_id", key) is None:
            return None
        node = t.capability(key, None)
        tel = t.lookup("repair_telemetry", "capability_id", key, partition=key)
        if tel is not None:
            r = tel.row
            s = LineageNode("dataset", f"repair_telemetry[{key}]", "synthesis of this capability's partition")
            s.table, s.version, s.run_id, s.code_version = tel.table, tel.version, r.get("_run_id"), r.get("_code_version")
            s.promoted_version = t.published("repair_telemetry", partition=key)
            s.upstream_versions = {k: int(v) for k, v in _loads(r.get("_upstream_versions"), {}).items()}
            s.attrs = {k: r.get(k) for k in ("drafts", "accepted", "survival_rate", "first_pass_rate", "mean_rounds_accepted")}
            node.children.append(s)
        return node
    raise AssertionError(kind)


def transcript_summary(messages_json: str | None, reply_chars: int = 240) -> dict[str, Any]:
    """The calls a benchmark trial made, in order, and its last reply (cut at ``reply_chars``; the full transcript
    stays in the row's ``messages_json``); {} for rows written before transcripts were kept."""
    if not messages_json:
        return {}
    try:
        msgs = json.loads(messages_json)
    except ValueError:
        return {"transcript": "unreadable messages_json"}
    calls = [c.get("function", {}).get("name") for m in msgs if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])]
    replies = [m.get("content") for m in msgs if m.get("role") == "assistant" and m.get("content")]
    out: dict[str, Any] = {"calls": calls}
    if replies:
        out["last_reply"] = replies[-1] if len(replies[-1]) <= reply_chars else replies[-1][:reply_chars] + "..."
    return out


def trace(lake: Lake, any_id: str, *, max_items: int = 3) -> LineageNode:
    """The lineage tree of ``any_id`` (see the module docstring for the id forms). Raises LineageError."""
    any_id = (any_id or "").strip()
    if not any_id:
        raise LineageError("empty id")
    t = _Tracer(lake, max_items=max_items)
    if not lake.exists(PROMOTIONS_TABLE) and not any(lake.exists(tb) for _, tb, _ in _LOOKUPS):
        raise LineageError(f"the lake {lake.root} has no tables (nothing materialized there yet?)")
    prefix, sep, rest = any_id.partition(":")
    tried: list[str] = []
    if sep and prefix == "score":
        found = _score_rows(t, rest)
        if found is None:
            raise LineageError(f"no benchmark score matches {any_id!r} in {lake.root} "
                               f"(forms: score:<run_id>:<checkpoint_id>:<env_id>:<trial>, score:<checkpoint_id>:<env_id>[:<trial>])")
        return t.score(*found)
    if sep and prefix in _PREFIXES:
        kind = _PREFIXES[prefix]
        for k, table, col in _LOOKUPS:
            if k == kind:
                tried.append(f"{table}.{col}")
                node = _build(t, k, table, rest)
                if node is not None:
                    return node
        raise LineageError(_unknown(any_id, lake, tried))
    if "@" in any_id:
        a, _, b = any_id.partition("@")
        for env_id, who in ((a, b), (b, a)):
            found = _find_scores(t, who, env_id, None, None)
            if found is not None:
                return t.score(*found)
        tried.append("benchmark_scores (env_id@checkpoint_id)")
    for kind, table, col in _LOOKUPS:
        tried.append(f"{table}.{col}")
        node = _build(t, kind, table, any_id)
        if node is not None:
            return node
    raise LineageError(_unknown(any_id, lake, tried))


def _unknown(any_id: str, lake: Lake, tried: list[str]) -> str:
    missing = sorted({x.split(".")[0] for x in tried if "." in x and not lake.exists(x.split(".")[0])})
    text = f"unknown id {any_id!r}: not found in the lake {lake.root} (looked in {', '.join(tried)})"
    if missing:
        text += f"; tables not in this lake: {', '.join(missing)}"
    return text + ". Id forms: " + "; ".join(ID_FORMS)


def trace_json(lake: Lake, any_id: str, *, max_items: int = 3) -> dict[str, Any]:
    node = trace(lake, any_id, max_items=max_items)
    return {"query": any_id, "lake": lake.root, "resolved": {"kind": node.kind, "id": node.id}, "tree": node.to_dict()}

