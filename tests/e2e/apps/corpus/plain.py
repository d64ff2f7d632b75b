"""Example: nothing third-party."""
import json

print(json.dumps({}))
