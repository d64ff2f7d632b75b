"""Example: a histogram."""
import numpy

print(numpy.histogram([1, 2, 2, 3]))
