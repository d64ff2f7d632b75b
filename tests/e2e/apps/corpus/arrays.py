"""Example: arrays."""
import os

import numpy as np

print(np.zeros(3), os.sep)
