#!/usr/bin/env python3
"""Evolution strategies (Salimans et al. 2017; or Mania et al. 2018's ARS
step with --update ars --top K, Hopper's default) on gymnasium environments,
on a fiber pool, multiprocessing's or Ray's: the same script, the same
numbers, chosen by --pool.  docs/examples/python-es.md explains it.

    PYTHONPATH=python build/venv-examples/bin/python examples/python/es.py --env CartPole-v1

One line per iteration: iteration, mean and best return of the
perturbed policies, the unperturbed policy's mean over new start states
(when evaluated), episodes and steps per second, elapsed time.

Exit status: 0 when the target was reached and confirmed on new start
states (or, with no target, when the iterations or the time ran out),
1 when a target was not reached or the run failed, 2 for a bad command line,
3 when the cluster asked the run to stop and its checkpoint was saved.

Stop and resume (--pool fiber): with --checkpoint the run saves after every
iteration (--checkpoint-every, 1 by default; write then rename) and, when
the cluster asks the master to stop (SIGTERM; Slurm's SIGUSR1 before the
time limit: fiber.on_stop_requested), saves the last completed iteration
from the stop callback and ends between iterations.  A restarted run
(fiber.resumed() > 0, as `fiber run --requeue` sets it) or one given
--resume without a file continues from --checkpoint's file when it exists.
"""
import argparse
import copy
import os
import pickle
import sys
import threading
import time

START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import es_pools  # noqa: E402
import es_train  # noqa: E402
import es_worker  # noqa: E402

# Per environment: what the run does unless told otherwise.
#   pairs: mirrored pairs per iteration (population = 2 x pairs)
#   alive_bonus: subtracted per step from the training fitness (not from
#       the returns shown), as Mania et al. do for the locomotion tasks, so
#       that standing still is not a local optimum
ENV_DEFAULTS = {
    "CartPole-v1": dict(pairs=16, sigma=0.1, lr=0.05, l2=0.005, hidden=(),
                        alive_bonus=0.0, eval_every=1, eval_episodes=20, target=500.0),
    # Mania et al.'s ARS V2-t (their Hopper-v1 settings: 8 directions, top 4,
    # nu 0.025, step 0.01); Salimans et al.'s update (--update es --pairs 128
    # --sigma 0.02 --lr 0.02 --l2 0.005) reached 2,590 in 20 minutes here.
    "Hopper-v5": dict(pairs=8, top=4, update="ars", sigma=0.025, lr=0.01, l2=0.0, hidden=(),
                      alive_bonus=1.0, eval_every=10, eval_episodes=10, target=None),
    "Humanoid-v5": dict(pairs=128, sigma=0.02, lr=0.01, l2=0.005, hidden=(),
                        alive_bonus=5.0, eval_every=5, eval_episodes=10, target=None),
    "BipedalWalker-v3": dict(pairs=64, sigma=0.05, lr=0.02, l2=0.005, hidden=(32, 32),
                             alive_bonus=0.0, eval_every=5, eval_episodes=10, target=None),
}
GENERIC_DEFAULTS = dict(pairs=64, sigma=0.05, lr=0.02, l2=0.005, hidden=(64, 64),
                        alive_bonus=0.0, eval_every=5, eval_episodes=10, target=None,
                        top=0, update="es")
# What changes the numbers: fixed by a checkpoint, so a resumed run
# continues the same computation.
ALGORITHM_KEYS = ("env", "seed", "pairs", "sigma", "lr", "l2", "hidden",
                  "alive_bonus", "noise_seed", "noise_size", "top", "update")
# What a checkpoint written before a key existed ran with.
CHECKPOINT_LEGACY = dict(top=0, update="es")


UPDATES = ("es", "ars")


class RunError(Exception):
    """A bad checkpoint or a resumed run's conflicting settings."""


def parse_hidden(text):
    if text in ("", "linear", "0"):
        return ()
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("--hidden wants sizes like 64,64 (or 'linear'), not %r" % text)
    if any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError("--hidden sizes must be positive: %r" % text)
    return sizes


def positive(kind):
    def check(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("not a number: %r" % text)
        if v <= 0:
            raise argparse.ArgumentTypeError("must be positive: %r" % text)
        return v
    return check


def arg_parser():
    p = argparse.ArgumentParser(
        description="Evolution strategies (Salimans et al. 2017) on gymnasium, "
                    "on fiber, multiprocessing or Ray. The fiber backend comes "
                    "from the configuration (FIBER_BACKEND, .fiberconfig).")
    p.add_argument("--env", help="CartPole-v1 (default), Hopper-v5, Humanoid-v5, "
                   "BipedalWalker-v3, or any gymnasium id with a Box observation")
    p.add_argument("--pool", choices=es_pools.KINDS, default="fiber",
                   help="fiber (default), multiprocessing, ray, or none (this process)")
    p.add_argument("--workers", type=positive(int), default=os.cpu_count() or 1,
                   help="pool workers (default: one per CPU)")
    p.add_argument("--seed", type=int, help="one seed for the policy, the "
                   "perturbations and the start states (default 1)")
    p.add_argument("--pairs", type=positive(int), help="mirrored pairs per iteration")
    p.add_argument("--sigma", type=positive(float), help="noise scale")
    p.add_argument("--lr", type=positive(float), help="Adam step size")
    p.add_argument("--l2", type=float, help="weight decay")
    p.add_argument("--hidden", type=parse_hidden,
                   help="hidden layer sizes (64,64) or 'linear'")
    p.add_argument("--top", type=int, help="only the TOP pairs whose better "
                   "fitness is highest make the step (0: all; ARS V2-t's b)")
    p.add_argument("--update", choices=UPDATES, help="es: centered ranks and "
                   "Adam (Salimans et al.); ars: fitness differences, step lr / "
                   "(top x std of their fitnesses) (Mania et al.'s ARS)")
    p.add_argument("--alive-bonus", type=float, help="subtracted per step from "
                   "the training fitness (Hopper 1, Humanoid 5)")
    p.add_argument("--noise-size", type=positive(int), help="floats in the noise table (2**24)")
    p.add_argument("--eval-every", type=int, help="evaluate the unperturbed "
                   "policy every K iterations (0: never)")
    p.add_argument("--eval-episodes", type=positive(int), help="episodes of that evaluation")
    p.add_argument("--target", type=float, help="stop when the evaluation's mean "
                   "return reaches this, once --test-episodes new starts confirm it")
    p.add_argument("--test-episodes", type=int, default=20,
                   help="new start states of the final test (20; 0: none)")
    p.add_argument("--iterations", type=positive(int), help="stop after this many iterations in all")
    p.add_argument("--time-limit", type=positive(float), help="stop after this many seconds of this run")
    p.add_argument("--pairs-per-task", type=positive(int), default=1,
                   help="pairs one pool task evaluates (1)")
    p.add_argument("--checkpoint", help="save the run here (atomically)")
    p.add_argument("--checkpoint-every", type=positive(int), default=1,
                   help="iterations between checkpoints (1), at the end, and "
                   "when the cluster asks the run to stop (exit 3)")
    p.add_argument("--resume", nargs="?", const="", metavar="FILE",
                   help="continue the run saved in FILE; without FILE, the one "
                   "in --checkpoint if it exists (as a restarted run does)")
    p.add_argument("--plot", help="write the return curve to this PNG (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no per-iteration lines")
    return p


def resolve_config(args, saved):
    """The run's configuration: the command line, then the checkpoint's,
    then the environment's defaults.  A resumed run may not change what
    changes the numbers."""
    saved = dict(CHECKPOINT_LEGACY, **saved) if saved else None
    cfg = dict(saved) if saved else {}
    if saved:
        for key in ALGORITHM_KEYS:
            given = getattr(args, key, None)
            if given is not None and given != saved[key]:
                raise RunError("--%s %s differs from the checkpoint's %s: a resumed run "
                               "keeps its settings" % (key.replace("_", "-"), given, saved[key]))
    env = args.env or cfg.get("env") or "CartPole-v1"
    defaults = dict(GENERIC_DEFAULTS, **ENV_DEFAULTS.get(env, {}))
    defaults.update(env=env, seed=1, noise_seed=12345, noise_size=2 ** 24)
    for key, default in defaults.items():
        given = getattr(args, key, None)
        if given is not None:
            cfg[key] = given
        elif key not in cfg:
            cfg[key] = default
    cfg["pairs_per_task"] = args.pairs_per_task
    if not 0 <= cfg["top"] <= cfg["pairs"]:
        raise RunError("--top %d must be between 0 (all pairs) and --pairs %d"
                       % (cfg["top"], cfg["pairs"]))
    return cfg


def env_info(name):
    """(obs_dim, act_dim, discrete, low, high) of environment `name`."""
    import gymnasium as gym
    env = es_worker.make_env(name)
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise es_worker.EnvError("%s: the ES policies need a flat Box observation, not %s"
                                     % (name, obs_space))
        if isinstance(act_space, gym.spaces.Discrete):
            return (obs_space.shape[0], int(act_space.n), True, None, None)
        if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
            return (obs_space.shape[0], act_space.shape[0], False,
                    act_space.low.tolist(), act_space.high.tolist())
        raise es_worker.EnvError("%s: unsupported action space %s" % (name, act_space))
    finally:
        env.close()


def save_checkpoint(path, trainer, elapsed, rng_state=None):
    st = trainer.state()
    st["elapsed"] = elapsed
    if rng_state is not None:   # the generator as the last iteration left it
        st["rng"] = rng_state
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(st, f, protocol=4)
    os.replace(tmp, path)


def load_checkpoint(path):
    try:
        with open(path, "rb") as f:
            st = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError) as e:
        raise RunError("cannot read checkpoint %s: %s" % (path, e)) from None
    if not isinstance(st, dict) or st.get("format") != "fiber-es-1":
        raise RunError("%s is not an ES checkpoint" % path)
    return st


def plot(path, history, title):
    """The return curve against time, as a PNG; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    minutes = [h["elapsed"] / 60 for h in history]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=80)
    ax.plot(minutes, [h["mean"] for h in history], label="population mean", lw=1)
    ax.plot(minutes, [h["best"] for h in history], label="population best", lw=0.8, alpha=0.6)
    ev = [(m, h["eval"]) for m, h in zip(minutes, history) if h["eval"] is not None]
    if ev:
        ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", ms=3,
                label="unperturbed policy (new starts)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def progress_line(rec):
    ev = "%9.1f" % rec["eval"] if rec["eval"] is not None else "%9s" % "-"
    return ("iter %4d  mean %9.1f  best %9.1f  eval %s  episodes/s %7.1f  steps/s %8.0f  "
            "elapsed %7.1f s" % (rec["iteration"], rec["mean"], rec["best"], ev,
                                 rec["episodes_per_s"], rec["steps_per_s"], rec["elapsed"]))


def run_test(pool, trainer, episodes):
    results = pool.map(es_worker.run_task, trainer.test_tasks(episodes), chunksize=1)
    return np.array([e[0] for r in results for e in r])


class StopGuard:
    """Saves the last completed iteration when fiber's stop event fires
    (on fiber's stop thread), and tells the loop to end.  `lock` is held
    while the trainer's state changes."""

    def __init__(self, path):
        self.path, self.lock = path, threading.Lock()
        self.trainer, self.elapsed = None, 0.0
        self.rng_state = None  # before the current iteration drew its tasks

    def arm(self):
        import fiber
        fiber.on_stop_requested(self.on_stop)

    def on_stop(self, sig):
        with self.lock:
            if self.trainer is None:
                return
            save_checkpoint(self.path, self.trainer, self.elapsed + time.time() - START,
                            self.rng_state)
            print("es: stop requested (signal %d): saved iteration %d to %s"
                  % (sig, self.trainer.iteration, self.path), file=sys.stderr, flush=True)

    @staticmethod
    def requested():
        import fiber
        return fiber.stop_requested()


def resume_path(args):
    """The checkpoint to continue from: --resume FILE; or --checkpoint's
    file for --resume alone and for a restarted run (fiber.resumed())."""
    if args.resume:
        return args.resume
    restarted = False
    if args.pool == "fiber" and args.checkpoint:
        import fiber
        restarted = fiber.resumed() > 0
    if (args.resume == "" or restarted) and args.checkpoint:
        if os.path.exists(args.checkpoint):
            return args.checkpoint
        print("es: no checkpoint at %s yet: starting afresh" % args.checkpoint, flush=True)
    elif args.resume == "":
        raise RunError("--resume without a file needs --checkpoint FILE")
    return None


def train(args):
    args.resume = resume_path(args)
    saved = load_checkpoint(args.resume) if args.resume else None
    cfg = resolve_config(args, saved["config"] if saved else None)
    info = env_info(cfg["env"])
    trainer = es_train.Trainer(cfg, info)
    elapsed0 = 0.0
    if saved:
        try:
            trainer.load(saved)
        except ValueError as e:
            raise RunError("%s: %s" % (args.resume, e)) from None
        elapsed0 = float(saved.get("elapsed", 0.0))
    p = trainer.policy
    print("es: %s, %s policy %s (%d parameters), %d mirrored pairs per iteration%s, "
          "update %s, sigma %g, lr %g, l2 %g, alive bonus %g, seed %d"
          % (cfg["env"], "linear" if not p.hidden else "MLP",
             "-".join(str(s) for s in (p.obs_dim,) + p.hidden + (p.act_dim,)),
             p.num_params, cfg["pairs"],
             " (top %d step)" % cfg["top"] if 0 < cfg["top"] < cfg["pairs"] else "",
             cfg["update"], cfg["sigma"], cfg["lr"], cfg["l2"],
             cfg["alive_bonus"], cfg["seed"]), flush=True)
    if saved:
        print("es: resumed %s at iteration %d (%.1f s of earlier runs)"
              % (args.resume, trainer.iteration, elapsed0), flush=True)
    t_pool = time.time()
    pool = es_pools.make_pool(args.pool, args.workers, es_worker.init_worker,
                              (cfg["noise_seed"], cfg["noise_size"]))
    backend = os.environ.get("FIBER_BACKEND", "local") if args.pool == "fiber" else "-"
    print("es: pool %s%s, %d workers, started in %.2f s"
          % (args.pool, " (backend %s)" % backend if args.pool == "fiber" else "",
             args.workers, time.time() - t_pool), flush=True)
    guard = None
    if args.pool == "fiber" and args.checkpoint:
        guard = StopGuard(args.checkpoint)
        guard.trainer, guard.elapsed = trainer, elapsed0
        guard.arm()
    status = run_loop(args, cfg, trainer, pool, elapsed0, guard)
    if guard:
        with guard.lock:
            guard.trainer = None
    es_pools.close_pool(args.pool, pool)
    return status


def run_loop(args, cfg, trainer, pool, elapsed0, guard=None):
    target, every = cfg["target"], cfg["eval_every"]
    run_start = time.time()
    title = "%s, %s pool, %d workers" % (cfg["env"], args.pool, args.workers)
    status = 0 if target is None else 1
    lock = guard.lock if guard else threading.Lock()
    while True:
        if guard and guard.requested():
            with lock:
                save_checkpoint(args.checkpoint, trainer, elapsed0 + time.time() - START)
            print("es: stopped by signal %d after iteration %d; checkpoint %s (continue "
                  "with --resume, or as a restarted run)"
                  % (guard.requested(), trainer.iteration, args.checkpoint), flush=True)
            return 3
        if args.iterations and trainer.iteration >= args.iterations:
            break
        if args.time_limit and time.time() - run_start >= args.time_limit:
            print("es: time limit of %g s reached" % args.time_limit, flush=True)
            break
        evaluate = every > 0 and (trainer.iteration + 1) % every == 0
        if guard:
            # tasks() draws from the generator: a stop callback saving
            # during this iteration saves the generator as it is now.
            with lock:
                guard.rng_state = copy.deepcopy(trainer.rng.bit_generator.state)
        tasks = trainer.tasks(evaluate)
        t = time.time()
        results = es_pools.map_tasks(args.pool, pool, es_worker.run_task, tasks)
        dt = max(time.time() - t, 1e-9)
        with lock:
            rec = trainer.update(results)
            if guard:
                guard.rng_state = None  # the iteration is whole again
        rec.update(seconds=dt, episodes_per_s=rec["episodes"] / dt,
                   steps_per_s=rec["steps"] / dt,
                   elapsed=elapsed0 + time.time() - START)
        trainer.history.append(rec)
        if not args.quiet:
            print(progress_line(rec), flush=True)
        done = False
        if target is not None and rec["eval"] is not None and rec["eval"] >= target:
            test = run_test(pool, trainer, args.test_episodes)
            if test.mean() >= target:
                print("es: solved at iteration %d after %.1f s: the policy averages %.1f "
                      "on %d new start states (lowest %.1f)"
                      % (trainer.iteration, elapsed0 + time.time() - START, test.mean(),
                         test.size, test.min()), flush=True)
                status, done = 0, True
            else:
                print("es: the test on %d new start states gave %.1f: training on"
                      % (test.size, test.mean()), flush=True)
        if args.checkpoint and (done or trainer.iteration % args.checkpoint_every == 0):
            with lock:
                save_checkpoint(args.checkpoint, trainer, elapsed0 + time.time() - START)
            if args.plot:
                plot(args.plot, trainer.history, title)
        if done:
            break
    if args.checkpoint:
        with lock:
            save_checkpoint(args.checkpoint, trainer, elapsed0 + time.time() - START)
    if target is None and args.test_episodes:
        test = run_test(pool, trainer, args.test_episodes)
        print("es: after %d iterations (%d training steps, %.1f s): the policy averages "
              "%.1f on %d new start states (lowest %.1f, highest %.1f)"
              % (trainer.iteration, trainer.timesteps, elapsed0 + time.time() - START,
                 test.mean(), test.size, test.min(), test.max()), flush=True)
    elif status:
        print("es: target %g not reached in %d iterations" % (target, trainer.iteration), flush=True)
    if args.plot and trainer.history:
        if plot(args.plot, trainer.history, title):
            print("es: wrote %s" % args.plot, flush=True)
        else:
            print("es: --plot needs matplotlib (pip install matplotlib); no plot written",
                  file=sys.stderr, flush=True)
    return status


def main(argv=None):
    args = arg_parser().parse_args(argv)
    try:
        return train(args)
    except (es_worker.EnvError, es_pools.PoolError, RunError) as e:
        print("es: %s" % e, file=sys.stderr, flush=True)
        return 2 if isinstance(e, RunError) else 1


if __name__ == "__main__":
    sys.exit(main())
