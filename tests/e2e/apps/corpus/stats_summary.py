"""Example: summary statistics."""
import humanize
import numpy as np

print(humanize.naturalsize(np.arange(10).sum()))
