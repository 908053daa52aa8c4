"""The `cowork` command: run the pipeline, benchmark an endpoint, open the UI, serve a checkpoint, audit lineage."""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _home(args: argparse.Namespace) -> Path:
    return Path(args.home or os.environ.get("COWORK_HOME", ".cowork")).absolute()


def cmd_run(args: argparse.Namespace) -> int:
    from assets.run import ensure_home, run_all
    from cowork_pipeline.capabilities import CapabilityError
    from resources import SMOKE_PROFILE, LakeResource, ProfileResource

    home = _home(args)
    os.environ.setdefault("COWORK_HOME", str(home))
    overrides = dict(SMOKE_PROFILE) if args.profile == "smoke" else {"name": args.profile}
    if args.envs_per_capability:
        overrides["envs_per_capability"] = args.envs_per_capability
    if args.repair_rounds is not None:
        overrides["max_repair_rounds"] = args.repair_rounds
    if args.catalog:
        overrides["catalog_dir"] = str(Path(args.catalog).absolute())
    if args.injections:
        overrides["injections"] = args.injections
    if args.student_seed:
        overrides["student_seed"] = args.student_seed
    try:
        generator = _generator(args)
        agents = _agents(args)
        profile = ProfileResource(**overrides)
        lake = LakeResource(root=args.lake or str(home / "lake"))
        instance = ensure_home(home / "dagster_home")
        t0 = time.perf_counter()
        timings = run_all(profile, lake, instance, capabilities=args.capabilities.split(",") if args.capabilities else None,
                          generator=generator, until=args.until, agents=agents)
    except (CapabilityError, ValueError) as e:
        print(f"cowork run: {e}", file=sys.stderr)
        return 2
    from assets.summary import print_summary

    print_summary(lake.lake(), timings, time.perf_counter() - t0, until=args.until)
    return 0


def _generator(args: argparse.Namespace) -> Any:
    """The GeneratorResource the generator flags describe; a bad URL or option raises ValueError here,
    before anything runs."""
    from resources import GeneratorResource

    generator = GeneratorResource(backend=args.generator, base_url=args.base_url or "", model=args.model or "",
                                  api_key_env=args.api_key_env, concurrency=args.concurrency, response_cache=not args.no_llm_cache)
    generator.build()
    return generator


def _add_injections_arg(parser: argparse.ArgumentParser) -> None:
    from resources import INJECTIONS

    parser.add_argument("--injections", choices=list(INJECTIONS),
                        help="plant instructions to the agent (prompt injection) in what every capability reads from outside, "
                             "for none, about half or all of its seeds, over each file's difficulty.injections (default: the "
                             "files'; the shipped catalog plants none)")


def _add_generator_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("generator backend")
    g.add_argument("--generator", choices=["embedded", "llm"], default="embedded",
                   help="embedded: offline and seeded (default); llm: any OpenAI-compatible chat-completions endpoint")
    g.add_argument("--base-url", help="the endpoint's base URL, e.g. http://127.0.0.1:8000/v1 (--generator llm)")
    g.add_argument("--model", help="model name sent with every request (--generator llm)")
    g.add_argument("--api-key-env", default="OPENAI_API_KEY",
                   help="environment variable holding the API key (default OPENAI_API_KEY; unset: no Authorization header)")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (--generator llm; default 8)")
    g.add_argument("--no-llm-cache", action="store_true",
                   help="ask the endpoint again even for a request answered before (default: replay answers kept in <home>/llm-cache)")


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError(f"a temperature is a number in [0, 2], not {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return value


def _add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("models to benchmark behind OpenAI-compatible endpoints (repeat for several)")
    g.add_argument("--endpoint", action="append", default=[], metavar="BASE_URL",
                   help="e.g. http://127.0.0.1:8000/v1 (vLLM, SGLang, `cowork serve`, a hosted API)")
    g.add_argument("--endpoint-model", action="append", default=[], metavar="NAME", help="the model the endpoint serves (one per --endpoint)")
    g.add_argument("--endpoint-name", action="append", default=[], metavar="LABEL",
                   help="its label in the scores (agent endpoint:LABEL; default: the model's name)")
    g.add_argument("--endpoint-api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the endpoints' API key (default OPENAI_API_KEY; unset: none sent)")
    g.add_argument("--endpoint-concurrency", type=int, default=8, metavar="N", help="requests in flight per endpoint (default 8)")
    g.add_argument("--endpoint-max-tokens", type=int, default=0, metavar="N", help="tokens per turn (default: the endpoint's)")
    g.add_argument("--endpoint-temperature", type=_temperature, default=0.0, metavar="T",
                   help="sampling temperature (default 0: greedy); above 0, each trial samples with its own seed")
    g.add_argument("--no-agent-cache", action="store_true",
                   help="ask the endpoints again even for requests answered before (default: replay answers kept in <home>/agent-cache)")
    b = parser.add_argument_group("benchmark scores kept between runs")
    b.add_argument("--rescore", action="store_true",
                   help="score every agent again, leaving out earlier endpoints not given now (default: keep an agent's earlier "
                        "trials when its checkpoint, the environments, the settings and the code are unchanged)")
    b.add_argument("--drop-earlier-endpoints", action="store_true",
                   help="leave out endpoints scored by earlier runs and not given now (default: they stay in the comparison)")
    b.add_argument("--forget-endpoint", action="append", default=[], metavar="LABEL",
                   help="leave out this endpoint scored by an earlier run (repeat for several; the others stay)")


def _add_teacher_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("teacher (default: the embedded one, each environment's reference executed)")
    g.add_argument("--teacher-endpoint", metavar="BASE_URL",
                   help="a model behind an OpenAI-compatible endpoint demonstrates the training environments instead; "
                        "only trajectories the certified checkers pass become demonstrations")
    g.add_argument("--teacher-model", metavar="NAME", help="the model the teacher endpoint serves")
    g.add_argument("--teacher-api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the teacher endpoint's API key (default OPENAI_API_KEY)")
    g.add_argument("--teacher-concurrency", type=int, default=8, metavar="N", help="teacher requests in flight (default 8)")


def _agents(args: argparse.Namespace) -> Any:
    """The AgentsResource the endpoint flags describe; a bad URL or option raises ValueError here."""
    from resources import AgentsResource, EndpointConfig

    endpoints = getattr(args, "endpoint", [])
    names = getattr(args, "endpoint_name", []) + [""] * (len(endpoints) - len(getattr(args, "endpoint_name", [])))
    teacher = None
    if getattr(args, "teacher_endpoint", None):
        teacher = EndpointConfig(base_url=args.teacher_endpoint, model=args.teacher_model or "", api_key_env=args.teacher_api_key_env,
                                 concurrency=args.teacher_concurrency)
    agents = AgentsResource(endpoints=[EndpointConfig(base_url=u, model=m, name=n, api_key_env=args.endpoint_api_key_env,
                                                      concurrency=args.endpoint_concurrency, max_tokens=args.endpoint_max_tokens,
                                                      temperature=args.endpoint_temperature)
                                       for u, m, n in zip(endpoints, args.endpoint_model, names)],
                            teacher=teacher, response_cache=not getattr(args, "no_agent_cache", False),
                            rescore=getattr(args, "rescore", False), keep_earlier_endpoints=not getattr(args, "drop_earlier_endpoints", False),
                            forget_endpoints=getattr(args, "forget_endpoint", []))
    agents.build_teacher()
    agents.build()
    return agents


def cmd_eval(args: argparse.Namespace) -> int:
    from assets.run import ensure_home, run_benchmark
    from resources import SMOKE_PROFILE, LakeResource, ProfileResource

    home = _home(args)
    os.environ.setdefault("COWORK_HOME", str(home))
    profile = ProfileResource(**(dict(SMOKE_PROFILE) if args.profile == "smoke" else {"name": args.profile}))
    lake = LakeResource(root=args.lake or str(home / "lake"))
    try:
        agents = _agents(args)
        instance = ensure_home(home / "dagster_home")
        t0 = time.perf_counter()
        timings = run_benchmark(profile, lake, instance, agents)
    except ValueError as e:
        print(f"cowork eval: {e}", file=sys.stderr)
        return 2
    from assets.summary import print_summary

    print_summary(lake.lake(), timings, time.perf_counter() - t0, only=("benchmark_scores",))
    return 0


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if getattr(args, "cmd", None) in ("run", "ui", "eval"):
        if len(args.endpoint) != len(args.endpoint_model) or len(args.endpoint_name) > len(args.endpoint):
            p.error("give one --endpoint-model per --endpoint (and at most one --endpoint-name each)")
        if args.endpoint_concurrency < 1:
            p.error(f"--endpoint-concurrency must be at least 1, got {args.endpoint_concurrency}")
    if getattr(args, "cmd", None) in ("run", "ui"):
        if bool(args.teacher_endpoint) != bool(args.teacher_model):
            p.error("--teacher-endpoint and --teacher-model go together")
        if args.teacher_concurrency < 1:
            p.error(f"--teacher-concurrency must be at least 1, got {args.teacher_concurrency}")
    if getattr(args, "cmd", None) == "vacuum" and args.retain_hours < 1:
        p.error(f"--retain-hours must be at least 1 (a run writing meanwhile keeps its uncommitted files that long), got {args.retain_hours}")
    if getattr(args, "cmd", None) not in ("run", "ui"):
        return
    if args.generator == "llm" and not (args.base_url and args.model):
        p.error("--generator llm needs --base-url and --model")
    if args.generator == "embedded" and (args.base_url or args.model):
        p.error("--base-url and --model are for --generator llm (the embedded generator is offline)")
    checks = [("--concurrency", args.concurrency, 1)]
    if args.cmd == "run":
        checks += [("--repair-rounds", args.repair_rounds, 0), ("--envs-per-capability", args.envs_per_capability, 0),
                   ("--student-seed", args.student_seed, 0)]
    for flag, value, least in checks:
        if value is not None and value < least:
            p.error(f"{flag} must be at least {least}, got {value}")


def ui_environment(args: argparse.Namespace) -> dict[str, str]:
    """The environment of the code location `cowork ui` starts (another process): it reads the lake, the
    home folder, the generator, the endpoints and the profile's catalog and injections from there
    (``LakeResource``, ``GeneratorResource.from_env``, ``AgentsResource.from_env``, ``ProfileResource.from_env``)."""
    home = _home(args)
    from resources import ProfileResource

    profile = ProfileResource(catalog_dir=str(Path(args.catalog).absolute()) if args.catalog else "", injections=args.injections or "")
    return dict(os.environ, COWORK_LAKE=os.environ.get("COWORK_LAKE", str(home / "lake")), COWORK_HOME=str(home),
                **_generator(args).to_env(), **_agents(args).to_env(), **profile.to_env())


def cmd_ui(args: argparse.Namespace) -> int:
    from assets.run import ensure_home

    home = _home(args)
    try:
        env = ui_environment(args)
    except ValueError as e:
        print(f"cowork ui: {e}", file=sys.stderr)
        return 2
    ensure_home(home / "dagster_home")
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(Path(__file__).parent.parent / "workspace.yaml"),
           "-h", "127.0.0.1", "-p", str(args.port)]
    print("starting the Dagster UI on http://127.0.0.1:%d" % args.port, flush=True)
    return subprocess.call(cmd, env=env, cwd=str(Path(__file__).parent.parent))


def cmd_show(args: argparse.Namespace) -> int:
    import json

    from assets.lineage_cli import existing_lake
    from cowork_pipeline.describe import checker_source, describe, find_environment
    from cowork_pipeline.lake import Lake

    root = existing_lake(args, "show")
    if root is None:
        return 2
    try:
        rec = find_environment(Lake(root), args.env_id)
        if args.checker:
            if rec.spec is None:
                raise LookupError(f"{args.env_id} has no spec to read a checker from")
            print(checker_source(rec.spec, args.checker), end="")
        elif args.json:
            print(json.dumps(rec.to_json(), indent=2, ensure_ascii=False, default=str))
        else:
            print(describe(rec), end="")
    except (LookupError, KeyError) as e:
        print(f"cowork show: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    from assets.lineage_cli import existing_lake
    from assets.maintenance import vacuum
    from cowork_pipeline.lake import Lake, LakeError

    root = existing_lake(args, "vacuum")
    if root is None:
        return 2
    try:
        done = vacuum(Lake(root), args.retain_hours, args.dry_run)
    except (LakeError, OSError) as e:
        print(f"cowork vacuum: {e}", file=sys.stderr)
        return 1
    print("\n".join(done.lines()))
    return 0


def served_checkpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    """(the local folder to load, the model name to serve it as) for ``cowork serve CHECKPOINT``: a folder, a store
    folder's URI (fetched into the home), or a checkpoint the lake registers (by id, or ``base``/``sft``/``rl[:config]``
    for the current one), served under its id and fetched first when the lake keeps it in an object store."""
    from assets.models import local_model, model_dir
    from cowork_pipeline.lake import Lake, is_remote
    from cowork_pipeline.training.model_store import fetch

    ref = args.checkpoint
    if is_remote(ref):
        name = ref.rstrip("/").rsplit("/", 1)[-1]
        return str(fetch(ref, model_dir(Lake(ref), name))), name  # (into the home, as an object-store lake's steps do)
    if "/" in ref or os.sep in ref or Path(ref).expanduser().exists():
        return ref, None
    from assets.lineage_cli import default_lake
    from assets.models import model_trained_at
    from cowork_pipeline.training.registry import UnknownCheckpoint, find_checkpoint

    root = default_lake(args)
    if not is_remote(root) and not Path(root).is_dir():  # (not existing_lake: this message says what was asked)
        raise UnknownCheckpoint(f"{ref!r} is no folder here, and there is no lake at {root} to look it up in "
                                "(run `cowork run` first, or pass --lake PATH)")
    lake = Lake(root)
    rows = lake.read_promoted("checkpoints")[0].to_dicts() if lake.exists("checkpoints") else []
    if lake.exists("rl_checkpoints"):
        rows += lake.read_promoted("rl_checkpoints")[0].to_dicts()
    row = find_checkpoint(rows, ref, model_trained_at(lake))
    return local_model(lake, str(row["path"])), str(row["checkpoint_id"])


def cmd_serve(args: argparse.Namespace) -> int:
    from cowork_pipeline.lake import LakeError
    from cowork_pipeline.serving.server import serve
    from cowork_pipeline.training.model_store import ModelStoreError
    from cowork_pipeline.training.registry import UnknownCheckpoint
    from cowork_pipeline.training.student import CheckpointError

    os.environ.setdefault("COWORK_HOME", str(_home(args)))
    try:
        path, name = served_checkpoint(args)
    except UnknownCheckpoint as e:
        print(f"cowork serve: {e}", file=sys.stderr)
        return 2
    except (LakeError, ModelStoreError) as e:
        print(f"cowork serve: {e}", file=sys.stderr)
        return 1

    def announce(url: str) -> None:
        print(f"serving {name or path} at {url} (POST /chat/completions and /completions, GET /models; "
              "POST /tokenize and GET /health at the server's root; Ctrl-C stops)", flush=True)

    try:
        serve(path, host=args.host, port=args.port, model_name=name, announce=announce, max_batch=args.max_batch,
              continuous=args.batching == "continuous")
    except CheckpointError as e:
        print(f"cowork serve: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the address is taken, or not this machine's
        print(f"cowork serve: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return args.fn(args)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (argparse exits with status 2 and a message on bad options)."""
    p = parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    return args


def parser() -> argparse.ArgumentParser:
    """The ``cowork`` command's parser: every subcommand and its options."""
    p = argparse.ArgumentParser(prog="cowork", description="Synthesize, certify and train on coworker-agent environments.")
    p.add_argument("--home", help="state folder (default: $COWORK_HOME or ./.cowork)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="materialize the whole graph (default profile: embedded backends, tiny student, CPU)")
    r.add_argument("--profile", default="default", choices=["default", "smoke"])
    r.add_argument("--lake", help="lake root: a folder or an object-store URI (default: <home>/lake)")
    r.add_argument("--capabilities", help="comma-separated capability ids (default: all)")
    r.add_argument("--envs-per-capability", type=int, default=0, help="seeds drafted per capability (default: the profile's)")
    r.add_argument("--catalog", help="folder of capability YAML files (default: the catalog shipped with the package)")
    r.add_argument("--repair-rounds", type=int, help="revisions of a failing draft before it is rejected (default 3)")
    r.add_argument("--student-seed", type=int, default=0,
                   help="the student's seed: its initialization, batch order and RL sampling; environments, demonstrations and "
                        "the benchmark stay the same, and its checkpoints are registered beside seed 0's (default 0)")
    _add_injections_arg(r)
    from assets.order import RUN_ORDER

    r.add_argument("--until", choices=RUN_ORDER, metavar="ASSET",
                   help="stop after this asset, e.g. validated_environments to synthesize only (default: through benchmark_scores)")
    _add_generator_args(r)
    _add_endpoint_args(r)
    _add_teacher_args(r)
    r.set_defaults(fn=cmd_run)
    u = sub.add_parser("ui", help="start the Dagster UI on 127.0.0.1 (its runs, sensors and schedule use the generator given here)")
    u.add_argument("--port", type=int, default=3000)
    u.add_argument("--catalog", help="folder of capability YAML files its runs, sensor and schedule read (default: the shipped catalog)")
    _add_injections_arg(u)
    _add_generator_args(u)
    _add_endpoint_args(u)
    _add_teacher_args(u)
    u.set_defaults(fn=cmd_ui)
    e = sub.add_parser("eval", help="benchmark models behind OpenAI-compatible endpoints beside the students, on the lake's "
                                    "held-out environments (after `cowork run`); agents unchanged since their last scoring "
                                    "keep their trials")
    e.add_argument("--profile", default="default", choices=["default", "smoke"], help="trials and environments per capability")
    e.add_argument("--lake", help="lake root (default: <home>/lake)")
    _add_endpoint_args(e)
    e.set_defaults(fn=cmd_eval)
    s = sub.add_parser("serve", help="serve a checkpoint as an OpenAI-compatible endpoint on 127.0.0.1")
    s.add_argument("checkpoint", help="a checkpoint folder, a registered checkpoint id, or base / sft / rl[:CONFIG] for the "
                                      "current one (what the benchmark scores); a registered one is served under its id")
    s.add_argument("--lake", help="the lake whose registry names the checkpoint (default: $COWORK_LAKE or <home>/lake)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="0 takes a free port (the URL is printed)")
    s.add_argument("--max-batch", type=_positive_int, default=32, metavar="N",
                   help="requests generated together as one batch (default 32; more on a GPU)")
    s.add_argument("--batching", choices=("continuous", "static"), default="continuous",
                   help="continuous (default): requests join the running batch between decode steps and leave it when "
                        "done; static: a batch runs to its end before the next starts (what benchmarks compare with)")
    s.set_defaults(fn=cmd_serve)
    from assets.lineage_cli import register as register_lineage

    register_lineage(sub)
    w = sub.add_parser("show", help="one environment as a reviewer reads it: its turns and the reference's calls, the rubric, "
                                    "a planted instruction, and the mutants each item killed (or why it was rejected)")
    w.add_argument("env_id", help="an environment id, e.g. invoice_reconcile-000003")
    w.add_argument("--checker", metavar="ITEM", help="print the checker code of this rubric item instead")
    w.add_argument("--json", action="store_true", help="print the whole record (spec, verdicts, mutants) as JSON")
    w.add_argument("--lake", help="lake root (default: $COWORK_LAKE or <home>/lake)")
    w.set_defaults(fn=cmd_show)
    v = sub.add_parser("vacuum", help="delete the lake's files that no published version and no lineage reads any more "
                                      "(older versions stay readable only where something still reads them), and the "
                                      "weights of registered checkpoints that are neither current nor named by a score")
    v.add_argument("--retain-hours", type=int, default=168,
                   help="keep files removed less than this long ago (default 168, a week; at least 1: a run writing meanwhile "
                        "must keep the files it has not committed yet)")
    v.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    v.add_argument("--lake", help="lake root (default: $COWORK_LAKE or <home>/lake)")
    v.set_defaults(fn=cmd_vacuum)
    return p


if __name__ == "__main__":
    raise SystemExit(main())
