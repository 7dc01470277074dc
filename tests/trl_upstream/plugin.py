"""The pytest plugin that runs TRL's own test files offline, against TRL or against rlhfkit's drop-ins.

Loaded with ``-p plugin`` (``pytest.ini`` beside this file); the test files in ``upstream/`` are TRL's,
unchanged. It:

- points Hugging Face at the offline cache that ``hub.py`` fills (``HF_HUB_OFFLINE=1``), so a test's
  ``from_pretrained("trl-internal-testing/tiny-...")`` loads the rebuilt tiny model;
- answers ``datasets.load_dataset`` for the Hub datasets ``hub_data.py`` rebuilt (every other name goes to
  the real function, which fails offline, as it would for TRL);
- with ``--against rlhfkit``, binds the names ``trl.GRPOTrainer``, ``trl.SFTConfig``, … to
  ``rlhfkit.trl``'s classes before any test file imports them (TRL's helpers stay TRL's);
- records each test's outcome, whether it used a swapped class (built a config or trainer of the five
  trainers rlhfkit replaces), the one-line reason of a failure and the call's seconds into ``--outcomes FILE``
  (JSON), which ``report.py`` compares.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CACHE = Path(os.environ.get("TRL_UPSTREAM_CACHE", HERE.parents[1] / ".cache" / "trl-upstream")).resolve()
os.environ.setdefault("HF_HUB_CACHE", str(CACHE / "hub"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "disabled")

SWAPPED = ["GRPOConfig", "GRPOTrainer", "RLOOConfig", "RLOOTrainer", "SFTConfig", "SFTTrainer",
           "DPOConfig", "DPOTrainer", "RewardConfig", "RewardTrainer"]  # fmt: skip
_used_swapped = False


def pytest_addoption(parser):
    group = parser.getgroup("trl-upstream")
    group.addoption("--against", choices=["trl", "rlhfkit"], default="trl", help="whose classes the tests use")
    group.addoption("--outcomes", default=None, help="write each test's outcome here (JSON)")
    group.addoption("--resume", action="store_true", help="skip the tests FILE.partial already records")


def _mark_use(cls):
    """Wrap ``cls.__init__`` so that building one marks the running test as using a swapped class."""
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        global _used_swapped
        _used_swapped = True
        original(self, *args, **kwargs)

    cls.__init__ = __init__


def _offline_load_dataset():
    import datasets
    from hub_data import data_files

    real = datasets.load_dataset

    def load_dataset(path, name=None, *args, split=None, streaming=False, **kwargs):
        files = data_files(CACHE / "datasets", path, name)
        if files is None:
            return real(path, name, *args, split=split, streaming=streaming, **kwargs)
        return real("parquet", data_files=files, split=split, streaming=streaming)

    datasets.load_dataset = load_dataset


def _fill_missing_names():
    """Names TRL's main imports that the installed TRL 1.16 lacks, so each file still imports.

    The test files come from TRL's repository (``README.md``: the newest available offline), a few commits
    apart from the released package. ``is_joblib_available`` is an availability check and is answered as one;
    each other missing helper raises when called, so a test that needs it fails in both runs and stays outside
    the comparison.
    """
    import importlib
    import importlib.util

    import_utils = importlib.import_module("trl.import_utils")
    if not hasattr(import_utils, "is_joblib_available"):
        import_utils.is_joblib_available = lambda: importlib.util.find_spec("joblib") is not None
    for module_name, names in {"trl.trainer.sft_trainer": ["_chunked_cross_entropy_loss", "_patch_chunked_ce_lm_head",
                                                           "dft_loss"]}.items():  # fmt: skip
        module = importlib.import_module(module_name)
        for name in names:
            if not hasattr(module, name):

                def missing(*args, _name=f"{module_name}.{name}", **kwargs):
                    raise NotImplementedError(f"{_name} is not in the installed TRL")

                setattr(module, name, missing)


def pytest_configure(config):
    import trl

    _fill_missing_names()
    if not (CACHE / "hub").is_dir() or not (CACHE / "datasets").is_dir():
        raise pytest.UsageError(f"{CACHE} has no tiny models or datasets: run python tests/trl_upstream/hub.py first")
    _offline_load_dataset()
    if config.getoption("against") == "rlhfkit":
        import rlhfkit.trl

        for name in SWAPPED:
            setattr(trl, name, getattr(rlhfkit.trl, name))
    for name in SWAPPED:
        _mark_use(getattr(trl, name))
    config._trl_outcomes = {}
    partial = Path(f"{config.getoption('outcomes')}.partial")
    if config.getoption("outcomes") and not config.getoption("resume") and not hasattr(config, "workerinput"):
        partial.unlink(missing_ok=True)  # a fresh run records afresh


@pytest.fixture(autouse=True)
def _drop_in_configs_use_cpu(request, monkeypatch):
    """TRL's ``conftest.py`` fixture ``force_use_cpu_without_accelerator``, for the drop-in configs.

    TRL's configs default ``bf16`` to True, which ``TrainingArguments`` refuses on a CPU unless ``use_cpu``; TRL's
    own fixture sets ``use_cpu=True`` on TRL's config base class when no accelerator is present. With
    ``--against rlhfkit`` the tests build ``rlhfkit.trl``'s configs, so the same is done to them.
    """
    from transformers.testing_utils import torch_device

    if request.config.getoption("against") != "rlhfkit" or (torch_device is not None and torch_device != "cpu"):
        return
    import rlhfkit.trl

    for name in SWAPPED:
        cls = getattr(rlhfkit.trl, name)
        if name.endswith("Config"):
            original = cls.__post_init__

            def __post_init__(self, _original=original):
                self.use_cpu = True
                _original(self)

            monkeypatch.setattr(cls, "__post_init__", __post_init__)


@pytest.fixture(autouse=True)
def _in_a_temporary_directory(tmp_path, monkeypatch):
    """Tests that build a config without ``output_dir`` write TRL's default (``<model>-SFT`` …) into the
    working directory: it is each test's own temporary directory, never the repository."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _record_swapped_use(request):
    global _used_swapped
    _used_swapped = False
    yield
    request.node.user_properties.append(("swapped", _used_swapped))


def _reason(report) -> str:
    """The failure's one-line message (the exception's), or the skip's reason."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message).splitlines()[0][:300]
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])[:300]
    return ""


def pytest_runtest_logreport(report):
    config = getattr(pytest_runtest_logreport, "config", None)
    if config is None:
        return
    outcomes = config._trl_outcomes
    swapped = dict(report.user_properties).get("swapped", False)
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = "skipped" if report.skipped else report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xpassed" if report.passed else "xfailed"
        outcomes[report.nodeid] = [outcome, swapped, _reason(report), round(report.duration, 2)]
    elif report.when == "teardown":
        entry = outcomes.setdefault(report.nodeid, ["error", swapped, _reason(report), 0.0])
        entry[1] = entry[1] or swapped
        if report.failed and entry[0] == "passed":
            entry[0] = "error"
        path = config.getoption("outcomes")
        if path and not hasattr(config, "workerinput"):  # each finished test at once: a long run can resume
            with open(f"{path}.partial", "a") as partial:
                partial.write(json.dumps({report.nodeid: entry}) + "\n")


def _partial(config) -> dict[str, list]:
    """The outcomes an interrupted run with the same ``--outcomes`` recorded (its ``.partial`` file)."""
    path = Path(f"{config.getoption('outcomes')}.partial")
    done: dict[str, list] = {}
    finished = Path(str(config.getoption("outcomes")))
    if config.getoption("outcomes") and config.getoption("resume") and finished.is_file():  # a record to extend
        done.update(json.loads(finished.read_text()))
    if config.getoption("outcomes") and path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                done.update(json.loads(line))
    return done


def pytest_collection_modifyitems(config, items):
    """With ``--resume``: the tests an interrupted run already recorded are not run again."""
    if not config.getoption("resume"):
        return
    done = _partial(config)
    config._trl_outcomes.update(done)
    kept = [item for item in items if item.nodeid not in done]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
    items[:] = kept


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    pytest_runtest_logreport.config = session.config


def pytest_sessionfinish(session):
    path = session.config.getoption("outcomes")
    if path and not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist) writes
        outcomes = {**_partial(session.config), **session.config._trl_outcomes}
        Path(path).write_text(json.dumps(dict(sorted(outcomes.items())), indent=0) + "\n")
