"""Libraries that take a pool's map, used as their docs show with fiber's
Pool in place of multiprocessing's: DEAP (genetic algorithms: the
toolbox's "map") and emcee (MCMC: EnsembleSampler(pool=)).  Each run is
compared with the same run on the builtin map, from the same seeds: the
workers must compute exactly what the master would have."""
import pytest

pytestmark = pytest.mark.host_files   # the programs are written to tmp


DEAP = '''
import random
from deap import algorithms, base, creator, tools
import fiber

# At the top level, as DEAP's docs ask for multiprocessing: every job
# imports this module and so has the same classes.
creator.create("FitnessMax", base.Fitness, weights=(1.0,))
creator.create("Individual", list, fitness=creator.FitnessMax)


def one_max(individual):
    return sum(individual),


def evolve(map_fn):
    random.seed(64)
    tb = base.Toolbox()
    tb.register("bit", random.randint, 0, 1)
    tb.register("individual", tools.initRepeat, creator.Individual,
                tb.bit, 60)
    tb.register("population", tools.initRepeat, list, tb.individual)
    tb.register("evaluate", one_max)
    tb.register("mate", tools.cxTwoPoint)
    tb.register("mutate", tools.mutFlipBit, indpb=0.05)
    tb.register("select", tools.selTournament, tournsize=3)
    tb.register("map", map_fn)
    stats = tools.Statistics(key=lambda ind: ind.fitness.values[0])
    stats.register("max", max)
    pop, log = algorithms.eaSimple(tb.population(n=100), tb, cxpb=0.5,
                                   mutpb=0.2, ngen=15, stats=stats,
                                   verbose=False)
    return [ind.fitness.values for ind in pop], log.select("max")


if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        ours = evolve(pool.map)
    assert ours == evolve(map), "fiber's pool evolved another population"
    print("max fitness by generation", ours[1])
'''


def test_deap_evolves_the_same_population_on_fibers_pool(script):
    pytest.importorskip("deap")
    r = script(DEAP, timeout=300)
    assert r.returncode == 0, r.stderr
    best = eval(r.stdout.split("generation", 1)[1])
    assert len(best) == 16 and best[-1] > best[0]


EMCEE = '''
import numpy as np
import emcee
import fiber


def log_prob(theta):
    return -0.5 * float(np.sum(theta ** 2))


def chain(pool):
    rng = np.random.default_rng(42)
    start = rng.standard_normal((16, 3))
    np.random.seed(7)        # emcee draws its moves from numpy's global
    s = emcee.EnsembleSampler(16, 3, log_prob, pool=pool)
    s.run_mcmc(start, 100, progress=False)
    return s.get_chain()


if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        ours = chain(pool)
    assert np.array_equal(ours, chain(None)), "another chain on fiber's pool"
    print("chain", ours.shape)
'''


def test_emcee_samples_the_same_chain_on_fibers_pool(script):
    pytest.importorskip("emcee")
    r = script(EMCEE, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "chain (100, 16, 3)" in r.stdout
