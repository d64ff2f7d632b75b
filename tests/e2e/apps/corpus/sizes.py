"""Example: sizes."""
import humanize
import six

print(humanize.intcomma(10**6), six.PY3)
