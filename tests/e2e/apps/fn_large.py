"""Values over 4 MiB travel through S3 by reference, both ways."""

from levers9 import App

app = App("fnlarge")


@app.function(cpu=0.5, memory="512Mi")
def reverse(blob):
    return blob[::-1] + b"!" * (1 << 20)


if __name__ == "__main__":
    data = bytes(range(256)) * (6 << 12)  # 6 MiB
    out = reverse.remote(data)
    print("RESULT", len(out), out[: 1 << 20] == data[::-1][: 1 << 20], flush=True)
