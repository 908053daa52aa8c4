"""The `cowork` command: run the pipeline, open the UI, serve a checkpoint, audit lineage."""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def _home(args: argparse.Namespace) -> Path:
    return Path(args.home or os.environ.get("COWORK_HOME", ".cowork")).absolute()


def cmd_run(args: argparse.Namespace) -> int:
    from assets.run import ensure_home, run_all
    from resources import SMOKE_PROFILE, LakeResource, ProfileResource

    home = _home(args)
    os.environ.setdefault("COWORK_HOME", str(home))
    instance = ensure_home(home / "dagster_home")
    overrides = dict(SMOKE_PROFILE) if args.profile == "smoke" else {"name": args.profile}
    if args.envs_per_capability:
        overrides["envs_per_capability"] = args.envs_per_capability
    profile = ProfileResource(**overrides)
    lake = LakeResource(root=args.lake or str(home / "lake"))
    t0 = time.perf_counter()
    timings = run_all(profile, lake, instance, capabilities=args.capabilities.split(",") if args.capabilities else None)
    from assets.summary import print_summary

    print_summary(lake.lake(), timings, time.perf_counter() - t0)
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    from assets.run import ensure_home

    home = _home(args)
    ensure_home(home / "dagster_home")
    env = dict(os.environ, COWORK_LAKE=os.environ.get("COWORK_LAKE", str(home / "lake")))
    cmd = [sys.executable, "-m", "dagster", "dev", "-w", str(Path(__file__).parent.parent / "workspace.yaml"),
           "-h", "127.0.0.1", "-p", str(args.port)]
    print("starting the Dagster UI on http://127.0.0.1:%d" % args.port, flush=True)
    return subprocess.call(cmd, env=env, cwd=str(Path(__file__).parent.parent))


def cmd_serve(args: argparse.Namespace) -> int:
    from cowork_pipeline.serving.server import serve

    serve(args.checkpoint, host=args.host, port=args.port)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cowork", description="Synthesize, certify and train on coworker-agent environments.")
    p.add_argument("--home", help="state folder (default: $COWORK_HOME or ./.cowork)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="materialize the whole graph (default profile: embedded backends, tiny student, CPU)")
    r.add_argument("--profile", default="default", choices=["default", "smoke"])
    r.add_argument("--lake", help="lake root: a folder or an object-store URI (default: <home>/lake)")
    r.add_argument("--capabilities", help="comma-separated capability ids (default: all)")
    r.add_argument("--envs-per-capability", type=int, default=0)
    r.set_defaults(fn=cmd_run)
    u = sub.add_parser("ui", help="start the Dagster UI on 127.0.0.1")
    u.add_argument("--port", type=int, default=3000)
    u.set_defaults(fn=cmd_ui)
    s = sub.add_parser("serve", help="serve a checkpoint as an OpenAI-compatible endpoint on 127.0.0.1")
    s.add_argument("checkpoint")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.set_defaults(fn=cmd_serve)
    from assets.lineage_cli import register as register_lineage

    register_lineage(sub)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
