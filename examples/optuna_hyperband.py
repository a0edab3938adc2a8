#!/usr/bin/env python3
"""A Hyperband search with Optuna whose trials run on GPUs leased from Agora.

Trains a logistic-regression classifier (scikit-learn's SGDClassifier) on scikit-learn's
bundled hand-written digits, one epoch per iteration; Optuna's HyperbandPruner stops poor
trials early, and Agora sees the search as a successive-halving app. Each trial starts on a GPU
of one of the app's leases (printed with its CUDA UUID), checkpoints after every epoch, and,
when its lease ends or is revoked, stops and later resumes from its checkpoint.

    ./scripts/run                                          # another terminal: the demo arbiter
    pip install "./clients/python[examples]"
    AGORA_TOKEN=<a demo tenant's token from its log> python examples/optuna_hyperband.py

Sign in to the dashboard (http://127.0.0.1:8080) with the same token to watch the search's rho
move as its trials progress. `--pace` stretches each epoch to look like a bigger model.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import optuna
from sklearn.datasets import load_digits
from sklearn.linear_model import SGDClassifier
from sklearn.model_selection import train_test_split

from agora_client import Client
from agora_client.optuna import AgoraTrial, run_study

EPOCHS = 27


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("AGORA_URL", "http://127.0.0.1:8080"), help="the arbiter (AGORA_URL)"
    )
    parser.add_argument(
        "--token", default=os.environ.get("AGORA_TOKEN"), help="a tenant's token (AGORA_TOKEN)"
    )
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--pace", type=float, default=0.5, help="least seconds per epoch (default 0.5)")
    parser.add_argument(
        "--name", default=f"digits-hyperband-{int(time.time())}", help="the app's name (unique per tenant)"
    )
    args = parser.parse_args()
    if not args.token:
        parser.error(
            "set AGORA_TOKEN (or --token) to a tenant's token: ./scripts/run prints the demo tenants' tokens"
        )
    if args.trials < 1 or args.pace < 0:
        parser.error("--trials must be at least 1 and --pace at least 0")
    return args


def make_objective(pace: float):
    features, labels = load_digits(return_X_y=True)
    train_x, valid_x, train_y, valid_y = train_test_split(
        features / 16.0, labels, test_size=0.3, random_state=0
    )
    classes = np.unique(labels)

    def objective(trial: optuna.Trial, run: AgoraTrial) -> float:
        alpha = trial.suggest_float("alpha", 1e-6, 1e-1, log=True)
        eta0 = trial.suggest_float("eta0", 1e-4, 1.0, log=True)
        state = run.restore()
        if state is None:
            state = {
                "epoch": 0,
                "model": SGDClassifier(
                    loss="log_loss",
                    alpha=alpha,
                    learning_rate="constant",
                    eta0=eta0,
                    random_state=trial.number,
                ),
            }
        else:
            print(
                f"trial {trial.number}: resumed at epoch {state['epoch']} "
                f"on {run.cuda_visible_devices} (lease {run.lease})"
            )
        error = 1.0
        while state["epoch"] < EPOCHS:
            started = time.monotonic()
            state["model"].partial_fit(train_x, train_y, classes=classes)
            state["epoch"] += 1
            error = 1.0 - state["model"].score(valid_x, valid_y)
            time.sleep(max(0.0, pace - (time.monotonic() - started)))
            run.report(error, state["epoch"], checkpoint=state)
        return error

    return objective


def main() -> int:
    args = arguments()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=EPOCHS, reduction_factor=3),
    )
    with Client(args.url, args.token) as agora:
        result = run_study(
            study,
            make_objective(args.pace),
            client=agora,
            app_name=args.name,
            n_trials=args.trials,
            max_iterations=EPOCHS,
            seconds_per_iteration=max(args.pace, 0.01),
        )
    states = [trial.state.name for trial in study.trials]
    print(
        f"app {result.app.id} ({result.app.name}): {states.count('COMPLETE')} trials complete, "
        f"{states.count('PRUNED')} pruned, "
        f"{result.preemptions} stopped at a lease's end and resumed, {len(result.leases)} leases"
    )
    print(f"best validation error {study.best_value:.4f} with {study.best_params}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
