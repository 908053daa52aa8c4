"""`cowork lineage <id> [--json] [--lake PATH]`: trace any score, checkpoint, rollout, demonstration, trajectory,
environment or repair attempt back to its capability spec, generator and repair attempts (see
:mod:`cowork_pipeline.lineage` for the id forms). Exit codes: 0 traced, 2 unknown id or no lake."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_UNKNOWN = 2

EPILOG = """id forms:
  score:<run_id>:<checkpoint_id>:<env_id>:<trial>   one benchmark trial (as printed in trees)
  score:<checkpoint_id>:<env_id>[:<trial>]           in the promoted benchmark_scores
  <env_id>@<checkpoint_id>                           every trial of a checkpoint on an environment
  ckpt:<id> rollout:<id> demo:<id> traj:<id> env:<id> attempt:<id> cap:<id>
  or any of those ids bare (looked up in that order)"""


def default_lake(args: argparse.Namespace) -> str:
    if getattr(args, "lake", None):
        return args.lake
    if os.environ.get("COWORK_LAKE"):
        return os.environ["COWORK_LAKE"]
    home = Path(getattr(args, "home", None) or os.environ.get("COWORK_HOME", ".cowork")).absolute()
    return str(home / "lake")


def existing_lake(args: argparse.Namespace, cmd: str) -> str | None:
    """The lake root the command reads (``--lake``, else the default), or None (and why, on stderr) when there is none."""
    from cowork_pipeline.lake import is_remote

    root = default_lake(args)
    if not is_remote(root) and not Path(root).is_dir():
        print(f"cowork {cmd}: no lake at {root} (run `cowork run` first, or pass --lake PATH)", file=sys.stderr)
        return None
    return root


def cmd_lineage(args: argparse.Namespace) -> int:
    from cowork_pipeline.lake import Lake
    from cowork_pipeline.lineage import LineageError, trace, trace_json

    root = existing_lake(args, "lineage")
    if root is None:
        return EXIT_UNKNOWN
    lake = Lake(root)
    try:
        if args.json:
            print(json.dumps(trace_json(lake, args.id, max_items=args.max_items), indent=2, ensure_ascii=False, default=str))
        else:
            print(trace(lake, args.id, max_items=args.max_items).render())
    except LineageError as e:
        print(f"cowork lineage: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    return 0


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("lineage", help="trace a score / checkpoint / rollout / demo / trajectory / environment / attempt id "
                                       "back to its capability spec and repair attempts",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("id", help="the id to trace (see the forms below)")
    p.add_argument("--json", action="store_true", help="print the tree as JSON")
    p.add_argument("--lake", help="lake root (default: $COWORK_LAKE or <home>/lake)")
    p.add_argument("--max-items", type=int, default=3,
                   help="expand at most N members of a training set (demonstrations, rollouts); 0 = all (default 3)")
    p.set_defaults(fn=cmd_lineage)
    return p
