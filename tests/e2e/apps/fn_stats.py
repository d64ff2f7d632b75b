"""A deployed function app: `levers9 deploy` makes its functions callable by name (Python, REST, CLI)."""

from levers9 import App

app = App("stats")


@app.function(cpu=0.5, memory="256Mi", retries=1)
def zscore(xs):
    mean = sum(xs) / len(xs)
    sd = (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5
    print(f"mean {mean}")
    return [round((x - mean) / sd, 3) if sd else 0.0 for x in xs]


@app.function(cpu=0.5, memory="128Mi", retries=1, timeout=60)
def hog(mib):
    blocks = []
    for _ in range(mib):
        blocks.append(bytearray(1 << 20))  # past the memory limit: the kernel kills the sandbox
    return len(blocks)


@app.function(cpu=0.5, memory="256Mi", timeout=2)
def sleepy(seconds):
    import time

    time.sleep(seconds)
    return seconds
