"""The suite's file order: the files conftest.py sends out first exist, so a rename cannot quietly
leave a long file to the end of a worker's queue."""
import importlib.util
from pathlib import Path


def test_every_file_sent_first_is_a_test_file():
    here = Path(__file__).parent
    spec = importlib.util.spec_from_file_location("suite_conftest", here / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert len(conftest.LONGEST_FIRST) > 1
    assert [name for name in conftest.LONGEST_FIRST if not (here / name).is_file()] == []


def test_the_suite_runs_files_in_collection_order():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert "--no-loadscope-reorder" in pyproject
