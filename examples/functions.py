"""Python functions: remote calls, map, spawn, a generator and a session (README, "Python functions")."""

from levers9 import App, Image

app = App("stats")
SCALE = 10  # module globals and helpers travel with the function

@app.function(cpu=1, memory="1Gi", image=Image(python_packages=["numpy"]), timeout=60, retries=2,
              packages=["humanize"], max_containers=4, concurrency=2)
def zscore(xs):
    import numpy as np
    a = np.asarray(xs, dtype=float)
    print(f"{len(a)} values")          # streams to your terminal as it happens
    return ((a - a.mean()) / (a.std() or 1) * SCALE).round(3).tolist()

@app.function(memory="256Mi")
def words(text):
    yield from text.split()            # a generator streams its items

if __name__ == "__main__":
    print(zscore.remote([1, 2, 3]))                   # the value
    print(list(zscore.map([[1, 2], [3, 4, 5]])))      # input order, fanned out over sandboxes
    handle = zscore.spawn([5, 6])
    print(handle.get(timeout=60))                     # or FunctionCall.from_id(handle.id)
    print(list(words.remote_gen("one two three")))
    with app.session():                               # one sandbox, its globals kept between calls
        zscore.remote([1, 2])
