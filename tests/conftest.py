import random

import numpy as np
import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
