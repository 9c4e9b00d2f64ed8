"""`dex-push CKPT --repo-id user/name [--private] [--dry-run]`: publish inducing adapters to the Hub.

Creates the repo (if needed) and uploads the checkpoint's README.md (model card), adapter config,
adapter weights and metrics.json through `huggingface_hub`. `--dry-run` prints exactly what would be
uploaded and touches no network. The endpoint is `--endpoint`, else `HF_ENDPOINT`, else the Hub.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dex-push", description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", help="inducing-adapter checkpoint directory (from train/distill.py)")
    parser.add_argument("--repo-id", required=True, help="user/name")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--dry-run", action="store_true", help="print what would be uploaded; upload nothing")
    parser.add_argument("--endpoint", default=os.environ.get("HF_ENDPOINT"), help="Hub endpoint URL")
    parser.add_argument("--token", default=None, help="Hub token (default: HF_TOKEN / cached login)")
    parser.add_argument("--base-model-id", default=None,
                        help="Hub id for the card's base_model (when the base was a local directory)")
    args = parser.parse_args(argv)

    from dex_adapt.distill.publish import push_checkpoint

    try:
        push_checkpoint(args.ckpt, args.repo_id, private=args.private, dry_run=args.dry_run,
                        endpoint=args.endpoint, token=args.token, base_hub_id=args.base_model_id)
    except (FileNotFoundError, ValueError) as e:
        print(f"dex-push: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # network / Hub errors: one line, not a traceback
        print(f"dex-push: error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
