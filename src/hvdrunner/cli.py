"""Command line: ``python -m hvdrunner doctor | demo``."""

from __future__ import annotations

import argparse
import sys


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
    demo = sub.add_parser(
        "demo", help="train a small Keras model on 2 Horovod ranks over local Spark"
    )
    demo.add_argument("--np", type=int, default=2)
    demo.add_argument("--epochs", type=int, default=8)
    demo.add_argument("--master", default="local[2]")
    demo.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from hvdrunner.doctor import run_doctor

        return run_doctor(args.master)
    from hvdrunner._demo import run_demo

    return run_demo(
        np=args.np, epochs=args.epochs, master=args.master, tracking_uri=args.tracking_uri
    )


if __name__ == "__main__":
    sys.exit(main())
