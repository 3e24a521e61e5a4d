#!/usr/bin/env python3
"""Population-based training (Jaderberg et al. 2017) over ES learners on
gymnasium, with a Manager, Queues and one Pool: the Python counterpart of
examples/population (docs/examples/python-pbt.md).

    PYTHONPATH=python build/venv/bin/python examples/python/pbt.py --env Pendulum-v1

Processes:
  master      owns the pool; serves the learners' evaluation requests (it
              batches every request waiting in its inbox into one map),
              prints one line per round, tests a winner, decides to stop;
  learner i   a Process holding one ES learner (es_train.Trainer) with its
              own sigma and lr: it trains through the master, scores its
              policy, posts to the leaderboard, and takes its own
              exploit/explore step against it;
  manager     the leaderboard and weights dicts, a lock, a counter, the
              stop event and the round barrier;
  queues      the master's inbox and one reply queue per learner.

--pool multiprocessing runs the same program on multiprocessing (spawn).

Exit status: 0 when the target was reached and confirmed on new start
states, 1 when the rounds ran out first or the run failed, 2 for a bad
command line.
"""
import argparse
import math
import os
import queue
import sys
import time

START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import es  # noqa: E402
import es_pools  # noqa: E402
import es_train  # noqa: E402
import es_worker  # noqa: E402

SCORE, FINAL = 3, 4          # seed streams (es_train: 0..2 are ES's own)
T_CRIT_19 = 1.729            # one-sided 5% t, 19 degrees of freedom

# Per environment: sigma and lr are drawn log-uniformly from these ranges.
PBT_DEFAULTS = {
    "CartPole-v1": dict(pairs=8, iters=2, rounds=10, target=500.0, hidden=(),
                        sigma=(0.01, 0.5), lr=(0.002, 0.3)),
    "Pendulum-v1": dict(pairs=32, iters=5, rounds=30, target=-200.0, hidden=(16,),
                        sigma=(0.01, 0.5), lr=(0.002, 0.3)),
}
GENERIC = dict(pairs=32, iters=5, rounds=20, target=None, hidden=(),
               sigma=(0.005, 0.2), lr=(0.002, 0.1))


def log_uniform(rng, lo, hi):
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def paired_t(a, b):
    """t statistic of the mean of a - b (paired samples)."""
    d = np.asarray(a) - np.asarray(b)
    sd = d.std(ddof=1)
    if sd == 0:
        return math.inf if d.mean() > 0 else 0.0
    return float(d.mean() / (sd / math.sqrt(d.size)))


# -- the learner process --------------------------------------------------

class Learner:
    """Learner i's state and its steps; the shared objects come in
    `shared` (the manager's proxies and the queues)."""

    def __init__(self, i, cfg, settings, shared):
        self.i, self.key = i, "L%d" % i
        self.settings, self.shared = settings, shared
        self.rng = np.random.default_rng([settings["seed"], i, 0xB7])
        cfg = dict(cfg, seed=settings["seed"] * 1000 + i)
        cfg["sigma"] = log_uniform(self.rng, *settings["sigma_range"])
        cfg["lr"] = log_uniform(self.rng, *settings["lr_range"])
        self.start = (cfg["sigma"], cfg["lr"])
        self.trainer = es_train.Trainer(cfg, settings["env_info"])
        self.trainer.adam.lr = cfg["lr"]
        self.parent, self.copied_round, self.exploits = -1, 0, 0

    def evaluate(self, tasks):
        """Runs tasks through the master; returns their results."""
        self.shared["inbox"].put(("eval", self.i, tasks))
        kind, results = self.shared["reply"][self.i].get()
        if kind != "results":
            raise RuntimeError("the master could not evaluate: %s" % results)
        return results

    def score(self, r):
        seeds = [es_train.episode_seed(self.settings["seed"], r, SCORE, k)
                 for k in range(self.settings["score_episodes"])]
        results = self.evaluate(eval_tasks(self.trainer, seeds))
        return [e[0] for res in results for e in res]

    def post(self, r, returns):
        t, sh = self.trainer, self.shared
        score = float(np.mean(returns))
        sh["weights"][self.key] = t.state()
        sh["board"][self.key] = {"round": r, "score": score, "returns": returns,
                                 "sigma": t.cfg["sigma"], "lr": t.adam.lr,
                                 "parent": self.parent, "copied_round": self.copied_round,
                                 "exploits": self.exploits, "start": self.start}
        with sh["lock"]:
            best = sh["board"].get("best")
            if best is None or (score, -r, -self.i) > (best["score"], -best["round"], -best["learner"]):
                sh["board"]["best"] = {"learner": self.i, "round": r, "score": score,
                                       "sigma": t.cfg["sigma"], "lr": t.adam.lr}
        return score

    def exploit_explore(self, r):
        """If this learner is in the bottom 20%, copies a top-20% learner
        that did significantly better (paired t-test on the same start
        states), then perturbs sigma and lr.  Returns True if it copied."""
        n = self.settings["learners"]
        board = self.shared["board"]
        entries = [board["L%d" % j] for j in range(n)]
        order = sorted(range(n), key=lambda j: (-entries[j]["score"], j))
        cut = max(1, n // 5)
        ready = r - self.copied_round >= self.settings["ready"]
        if self.i not in order[-cut:] or not ready:
            return False
        donor = order[int(self.rng.integers(0, cut))]
        if paired_t(entries[donor]["returns"], entries[self.i]["returns"]) <= T_CRIT_19:
            return False
        t = self.trainer
        keep = (t.rng.bit_generator.state, t.iteration, t.timesteps, t.episodes, t.history)
        t.load(self.shared["weights"]["L%d" % donor])
        t.rng.bit_generator.state = keep[0]   # a clone explores its own perturbations
        t.iteration, t.timesteps, t.episodes, t.history = keep[1:]
        t.cfg["sigma"] = self.perturb(t.cfg["sigma"], self.settings["sigma_range"])
        t.adam.lr = t.cfg["lr"] = self.perturb(t.adam.lr, self.settings["lr_range"])
        self.parent, self.copied_round = donor, r
        self.exploits += 1
        with self.shared["lock"]:            # a read-modify-write
            self.shared["exploits"].value += 1
        entry = dict(entries[self.i], sigma=t.cfg["sigma"], lr=t.adam.lr, parent=donor,
                     copied_round=r, exploits=self.exploits)
        board[self.key] = entry
        return True

    def perturb(self, value, bounds):
        lo, hi = bounds
        if self.rng.random() < 0.25:
            return log_uniform(self.rng, lo, hi)
        return float(min(hi, max(lo, value * (0.8 if self.rng.random() < 0.5 else 1.2))))

    def run(self):
        sh = self.shared
        for r in range(1, self.settings["rounds"] + 1):
            for _ in range(self.settings["iters"]):
                self.trainer.update(self.evaluate(self.trainer.tasks(False)))
            returns = self.score(r)
            score = self.post(r, returns)
            sh["inbox"].put(("round", self.i, r, score, self.trainer.cfg["sigma"],
                             self.trainer.adam.lr, self.parent if self.copied_round == r - 1 else -1))
            sh["barrier"].wait()
            if sh["stop"].is_set():
                return
            if self.settings["pbt"]:
                self.exploit_explore(r)
            sh["barrier"].wait()


def learner_main(i, cfg, settings, shared):
    """A learner process's target: runs learner i, reporting a failure
    to the master's inbox before it exits."""
    try:
        es_worker.init_worker(cfg["noise_seed"], cfg["noise_size"])
        Learner(i, cfg, settings, shared).run()
    except BaseException as e:   # noqa: B902 - reported, then re-raised
        shared["inbox"].put(("fail", i, "%s: %s" % (type(e).__name__, e)))
        raise


def eval_tasks(trainer, seeds):
    """Tasks scoring trainer's unperturbed policy from the given seeds."""
    mean, std = trainer.obs.mean_std()
    theta = trainer.theta.astype(np.float32)
    return [("eval", (trainer.cfg["env"], trainer.policy.spec(), theta, mean, std, [s]))
            for s in seeds]


# -- the master ---------------------------------------------------------

class Master:
    def __init__(self, args, mod, pool, shared, learners, settings, cfg):
        self.args, self.mod, self.pool, self.shared = args, mod, pool, shared
        self.procs, self.settings, self.cfg = learners, settings, cfg
        self.maps = self.requests = 0
        self.map_seconds = 0.0
        self.reports = {}

    def serve(self, first):
        """Runs `first` and every other request waiting, in one map."""
        batch, others = [first], []
        while True:
            try:
                msg = self.shared["inbox"].get_nowait()
            except queue.Empty:
                break
            (batch if msg[0] == "eval" else others).append(msg)
        tasks = [t for m in batch for t in m[2]]
        t = time.time()
        results = es_pools.map_tasks(self.args.pool, self.pool, es_worker.run_task, tasks)
        self.map_seconds += time.time() - t
        self.maps += 1
        self.requests += len(batch)
        at = 0
        for _, i, ts in batch:
            self.shared["reply"][i].put(("results", results[at:at + len(ts)]))
            at += len(ts)
        for m in others:
            self.handle(m)

    def handle(self, msg):
        if msg[0] == "eval":
            self.serve(msg)
        elif msg[0] == "round":
            _, i, r, score, sigma, lr, parent = msg
            self.reports.setdefault(r, {})[i] = (score, sigma, lr, parent)
        elif msg[0] == "fail":
            raise RuntimeError("learner L%d failed: %s" % (msg[1], msg[2]))

    def wait_round(self, r):
        """Serves requests until every learner reported round r."""
        n = self.settings["learners"]
        while len(self.reports.get(r, {})) < n:
            try:
                msg = self.shared["inbox"].get(timeout=1.0)
            except queue.Empty:
                for i, p in enumerate(self.procs):
                    if not p.is_alive():
                        raise RuntimeError("learner L%d ended (exit code %s) before the run did"
                                           % (i, p.exitcode))
                continue
            self.handle(msg)
        return self.reports.pop(r)

    def round_line(self, r, rep):
        scores = [rep[i][0] for i in sorted(rep)]
        hp = "  ".join("%.3f/%.3f%s" % (rep[i][1], rep[i][2], "*" if rep[i][3] >= 0 else " ")
                       for i in sorted(rep))
        print("round %3d  best %9.1f  mean %9.1f  %7.1f s  sigma/lr %s"
              % (r, max(scores), float(np.mean(scores)), time.time() - START, hp), flush=True)

    def test(self, learner):
        """The learner's policy on new start states; returns the returns."""
        trainer = es_train.Trainer(dict(self.cfg), self.settings["env_info"])
        trainer.load(self.shared["weights"]["L%d" % learner])
        seeds = [es_train.episode_seed(self.settings["seed"], 0, FINAL, k)
                 for k in range(self.args.test_episodes)]
        results = self.pool.map(es_worker.run_task, eval_tasks(trainer, seeds), chunksize=1)
        return np.array([e[0] for res in results for e in res])

    def run(self):
        target, solved = self.settings["target"], False
        for r in range(1, self.settings["rounds"] + 1):
            rep = self.wait_round(r)
            self.round_line(r, rep)
            best = max(rep, key=lambda i: (rep[i][0], -i))
            stop = r == self.settings["rounds"]
            if target is not None and rep[best][0] >= target:
                test = self.test(best)
                if test.mean() >= target:
                    print("solved in round %d after %.1f s: L%d's policy averages %.1f on %d new "
                          "start states (lowest %.1f)" % (r, time.time() - START, best,
                                                          test.mean(), test.size, test.min()),
                          flush=True)
                    solved = stop = True
                else:
                    print("L%d's policy averages %.1f on %d new start states: training on"
                          % (best, test.mean(), test.size), flush=True)
            if stop:
                self.shared["stop"].set()
            self.shared["barrier"].wait()
            if stop:
                break
            self.shared["barrier"].wait()
        return solved


def print_board(shared, n):
    board = shared["board"]
    print("leaderboard, read back from the manager:")
    for i in range(n):
        e = board["L%d" % i]
        copied = ("  copied %d time%s, last L%d after round %d"
                  % (e["exploits"], "" if e["exploits"] == 1 else "s", e["parent"], e["copied_round"])
                  if e["exploits"] else "")
        print("  L%d  round %3d  score %9.1f  sigma %.3f  lr %.3f  (started at %.3f/%.3f)%s"
              % (i, e["round"], e["score"], e["sigma"], e["lr"], e["start"][0], e["start"][1],
                 copied))
    b = board["best"]
    print("best score of the run: %.1f, L%d in round %d (sigma %.3f, lr %.3f)"
          % (b["score"], b["learner"], b["round"], b["sigma"], b["lr"]))


def arg_parser():
    p = argparse.ArgumentParser(description="Population-based training over ES learners "
                                "on gymnasium, with a Manager, Queues and one Pool.")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--pool", choices=("fiber", "multiprocessing"), default="fiber")
    p.add_argument("--learners", type=es.positive(int), default=4)
    p.add_argument("--rounds", type=es.positive(int))
    p.add_argument("--iters", type=es.positive(int), help="ES iterations per round")
    p.add_argument("--pairs", type=es.positive(int), help="mirrored pairs per iteration")
    p.add_argument("--hidden", type=es.parse_hidden)
    p.add_argument("--workers", type=es.positive(int), default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--target", type=float)
    p.add_argument("--score-episodes", type=int, default=20, choices=[20],
                   help="episodes of a round's score (20: the t-test's)")
    p.add_argument("--test-episodes", type=es.positive(int), default=100)
    p.add_argument("--ready", type=int, default=1,
                   help="rounds a learner trains before it may be replaced")
    p.add_argument("--no-pbt", action="store_true", help="independent learners, for comparison")
    return p


def main(argv=None):
    args = arg_parser().parse_args(argv)
    if args.learners < 2:
        print("pbt: --learners must be at least 2", file=sys.stderr)
        return 2
    d = dict(GENERIC, **PBT_DEFAULTS.get(args.env, {}))
    env_defaults = dict(es.GENERIC_DEFAULTS, **es.ENV_DEFAULTS.get(args.env, {}))
    try:
        info = es.env_info(args.env)
    except es_worker.EnvError as e:
        print("pbt: %s" % e, file=sys.stderr)
        return 1
    cfg = dict(env=args.env, seed=args.seed, pairs=args.pairs or d["pairs"], sigma=0.0, lr=0.0,
               l2=env_defaults["l2"], hidden=args.hidden if args.hidden is not None else d["hidden"],
               alive_bonus=env_defaults["alive_bonus"], noise_seed=12345, noise_size=2 ** 22,
               eval_episodes=0, pairs_per_task=1)
    settings = dict(seed=args.seed, learners=args.learners, rounds=args.rounds or d["rounds"],
                    iters=args.iters or d["iters"], target=args.target if args.target is not None
                    else d["target"], sigma_range=d["sigma"], lr_range=d["lr"],
                    score_episodes=args.score_episodes, ready=args.ready, pbt=not args.no_pbt,
                    env_info=info)
    if args.pool == "fiber":
        import fiber as mod
        mod.init()
    else:
        import multiprocessing
        mod = multiprocessing.get_context("spawn")
    print("pbt: %d ES learners on %s, %s pool of %d workers; %d pairs x %d iterations per round, "
          "at most %d rounds, target %s%s"
          % (args.learners, args.env, args.pool, args.workers, cfg["pairs"], settings["iters"],
             settings["rounds"], settings["target"], ", no exploit/explore" if args.no_pbt else ""),
          flush=True)
    manager = mod.Manager()
    shared = {"board": manager.dict(), "weights": manager.dict(), "lock": manager.Lock(),
              "exploits": manager.Value("i", 0), "stop": manager.Event(),
              "barrier": manager.Barrier(args.learners + 1),
              "inbox": mod.Queue(), "reply": [mod.Queue() for _ in range(args.learners)]}
    pool = mod.Pool(args.workers, initializer=es_worker.init_worker,
                    initargs=(cfg["noise_seed"], cfg["noise_size"]))
    procs = [mod.Process(target=learner_main, args=(i, cfg, settings, shared), name="learner-L%d" % i)
             for i in range(args.learners)]
    for p in procs:
        p.start()
    master = Master(args, mod, pool, shared, procs, settings, cfg)
    status = 1
    try:
        status = 0 if master.run() else 1
        for p in procs:
            p.join()
        print_board(shared, args.learners)
        exploits = shared["exploits"].value
        print("%d exploit steps; %d requests in %d pool maps, %.1f s inside the maps, %.1f s in all"
              % (exploits, master.requests, master.maps, master.map_seconds, time.time() - START))
    except RuntimeError as e:
        print("pbt: %s" % e, file=sys.stderr, flush=True)
        shared["stop"].set()
        shared["barrier"].abort()
        for p in procs:
            p.terminate()
    finally:
        pool.terminate()
        pool.join()
        manager.shutdown()
    return status


if __name__ == "__main__":
    sys.exit(main())
