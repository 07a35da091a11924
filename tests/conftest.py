import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """One token cache for the whole session, so the built-in corpus is tokenized once."""
    return tmp_path_factory.mktemp("k3lab-data")


@pytest.fixture
def isolated_data(data_dir, monkeypatch):
    monkeypatch.setenv("K3LAB_DATA_DIR", str(data_dir))
    return data_dir
