"""The joblib backend "fiber" (fiber.joblib_backend): joblib.Parallel and
scikit-learn's n_jobs on fiber's pool."""

import time

import pytest

import fiber
import helpers

joblib = pytest.importorskip("joblib")
import fiber.joblib_backend  # noqa: E402  (registers "fiber")


def test_parallel_runs_on_fiber_workers_in_order():
    with joblib.parallel_backend("fiber", n_jobs=2):
        out = joblib.Parallel()(joblib.delayed(helpers.add)(i, 10 * i)
                                for i in range(40))
        tokens = set(joblib.Parallel(batch_size=1)(
            joblib.delayed(helpers.process_token)(i) for i in range(20)))
    assert out == [11 * i for i in range(40)]
    assert helpers.process_token() not in tokens and len(tokens) >= 1


def test_n_jobs_one_runs_here():
    with joblib.parallel_backend("fiber", n_jobs=1):
        tokens = joblib.Parallel()(joblib.delayed(helpers.process_token)(i)
                                   for i in range(3))
    assert set(tokens) == {helpers.process_token()}


def test_an_exception_reaches_the_caller_and_the_backend_goes_on():
    with joblib.parallel_backend("fiber", n_jobs=2):
        with pytest.raises(helpers.CustomError) as e:
            joblib.Parallel()(joblib.delayed(helpers.custom_boom)(i)
                              for i in range(4))
        assert e.value.code in range(4)
        again = joblib.Parallel()(joblib.delayed(helpers.square)(i)
                                  for i in range(5))
    assert again == [0, 1, 4, 9, 16]


def test_large_arrays_go_through_the_object_store():
    np = pytest.importorskip("numpy")
    big = np.arange(300_000, dtype=np.float64)      # 2.4 MB
    small = np.arange(1000, dtype=np.float64)       # 8 kB
    with joblib.parallel_backend("fiber", n_jobs=2):
        got = joblib.Parallel(batch_size=1)(
            joblib.delayed(helpers.array_info)(a, i)
            for i, a in enumerate([big, small, big]))
    assert [g[0] for g in got] == [big.sum(), small.sum() + 1, big.sum() + 2]
    # By reference: read-only views of the stored bytes; by value: a copy.
    assert [g[1] for g in got] == [False, True, False]
    # Released after the call.  The store frees the blob once the master's
    # blob server has settled the workers' fetches (their OBJ_HAVE comes on
    # its own connection, after or before the result): on slurm CI it came
    # after Parallel returned.  So the count must fall to 0, within 30 s.
    deadline = time.monotonic() + 30
    while fiber.objects.stats()["objects"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fiber.objects.stats()["objects"] == 0
    # joblib's own threshold: Parallel(max_nbytes=...), None turns it off.
    with joblib.parallel_backend("fiber", n_jobs=2):
        got = joblib.Parallel(max_nbytes=None)(
            joblib.delayed(helpers.array_info)(big, 0) for _ in range(2))
        assert [g[1] for g in got] == [True, True]
        got = joblib.Parallel(max_nbytes="4K")(
            joblib.delayed(helpers.array_info)(small, 0) for _ in range(2))
        assert [g[1] for g in got] == [False, False]


def test_bad_backend_keywords_are_refused():
    with pytest.raises(ValueError, match="max_task_crashes"):
        with joblib.parallel_backend("fiber", n_jobs=2, max_task_crashes=-1):
            pass


def test_a_batch_that_kills_its_workers_fails_the_call():
    with joblib.parallel_backend("fiber", n_jobs=2, max_task_crashes=2):
        with pytest.raises(fiber.TaskCrashedError):
            joblib.Parallel(batch_size=1)(
                joblib.delayed(helpers.crash_on)(i, 2) for i in range(4))


def test_scikit_learn_grid_search_matches_the_sequential_one():
    pytest.importorskip("sklearn")
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    X, y = make_classification(n_samples=300, n_features=8, random_state=1)
    grid = {"C": [0.01, 0.1, 1.0, 10.0]}
    seq = GridSearchCV(LogisticRegression(), grid, cv=3, n_jobs=1).fit(X, y)
    with joblib.parallel_backend("fiber", n_jobs=2):
        par = GridSearchCV(LogisticRegression(), grid, cv=3).fit(X, y)
    assert par.best_params_ == seq.best_params_
    assert list(par.cv_results_["mean_test_score"]) == \
        list(seq.cv_results_["mean_test_score"])
