"""Build the embedded demo corpus into a folder.

    python data/build_demo.py --out runs/demo/data
"""
import argparse
import json

from climb.stages.embed.demo import build

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="runs/demo/data")
    print(json.dumps(build(ap.parse_args().out), indent=2))
