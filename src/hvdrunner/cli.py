"""Command line: ``python -m hvdrunner doctor | demo | migrate``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from hvdrunner._console import say

#: The demo's chain per framework: 01 and 03 are shared, 02 is the framework's training.
DEMO_NOTEBOOKS = {
    framework: ("01_prepare_data.py", f"02_train_{framework}.py", "03_batch_inference.py")
    for framework in ("keras", "torch")
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hvdrunner`` command.

    Example:
        >>> main(["doctor"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(prog="hvdrunner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doctor = sub.add_parser("doctor", help="check the Horovod/Spark/Petastorm/MLflow stack")
    doctor.add_argument(
        "--master", default=None, help="also start Spark with this master and count task slots"
    )
    doctor.add_argument("--quiet", action="store_true", help="print failed checks only")
    demo = sub.add_parser(
        "demo", help="run notebooks 01 -> 02 -> 03 locally: Horovod ranks on local Spark"
    )
    demo.add_argument("--notebooks", default="notebooks", help="folder holding the three notebooks")
    demo.add_argument("--framework", choices=sorted(DEMO_NOTEBOOKS), default="keras",
                      help="which training notebook: 02_train_keras (default) or 02_train_torch")  # fmt: skip
    demo.add_argument("--np", type=int, default=2)
    demo.add_argument("--epochs", type=int, default=10)
    demo.add_argument("--master", default="local[2]")
    demo.add_argument("--workdir", default=".hvdrunner/demo", help="data, cache and task values")
    demo.add_argument("--param", action="append", default=[], metavar="WIDGET=VALUE",
                      help="set a notebook widget, e.g. --param feed=petastorm (repeatable)")  # fmt: skip
    migrate = sub.add_parser("migrate", add_help=False,
                             help="rewrite HorovodRunner notebooks' imports for hvdrunner (a dry run unless --write)")  # fmt: skip
    migrate.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "migrate":
        from hvdrunner.migrate.files import main as migrate_main

        return migrate_main(args.rest)
    if args.command == "doctor":
        from hvdrunner.doctor import run_doctor

        return run_doctor(args.master, quiet=args.quiet)
    return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    """The README's main job: the three notebooks chained as one local job."""
    # MLflow's sqlite store narrates its schema migrations at INFO (alembic): not news to
    # someone running a demo. Real warnings still show.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # One store on every stack: MLflow 2.13 (15.4) would default to ./mlruns, 3.8 to sqlite.
    os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    import mlflow

    from hvdrunner import _console, _noise

    # MLflow 2.13 (15.4) ignores MLFLOW_LOGGING_LEVEL and narrates a new store's migrations
    # through alembic's own handlers: open the store once here, quietly, then keep MLflow's
    # INFO lines (experiment created, backend selected) out of the demo.
    with _console.replayed_without((*_noise.CHATTER, "INFO  [", " INFO mlflow.")):
        mlflow.MlflowClient().search_experiments()
    for name in ("alembic", "mlflow"):
        logging.getLogger(name).setLevel(logging.WARNING)

    from hvdrunner import notebook

    paths = [os.path.join(args.notebooks, name) for name in DEMO_NOTEBOOKS[args.framework]]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        say(
            f"ERROR: notebooks not found: {missing}; pass --notebooks DIR (the repo's notebooks/)",
            err=True,
        )
        return 2
    values = os.path.join(args.workdir, "task_values.json")
    if os.path.exists(values):
        os.remove(values)  # a fresh chain never reads a previous run's task values
    params = {
        "np": str(args.np),
        "epochs": str(args.epochs),
        "output_dir": os.path.join(args.workdir, "data"),
        "cache_dir": os.path.join(args.workdir, "cache"),
        "predictions_path": os.path.join(args.workdir, "predictions"),
        "train_task": f"train_{args.framework}",
    }
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            say(f"ERROR: --param {item!r}: expected WIDGET=VALUE", err=True)
            return 2
        params[key] = value  # a widget no notebook defines is refused by notebook.run
    code = notebook.run(paths, params, values, args.master)
    if code:
        return code
    with open(values) as f:
        out = json.load(f)
    say("\n==== hvdrunner demo ====")
    say(f"test accuracy: {out['batch_inference']['test_accuracy']:.3f}")
    say(f"MLflow run id: {out[f'train_{args.framework}']['run_id']}")
    say(f"view it:       mlflow ui --backend-store-uri {mlflow.get_tracking_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
