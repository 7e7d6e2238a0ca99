#!/usr/bin/env python3
"""Byte-granular insert and collapse through `tandem insert` / `tandem collapse`, checked
step by step against a model (a bytearray) of what the file must contain.

usage: insert_collapse_check.py TANDEM FILE SEED STEPS
"""
import os
import random
import subprocess
import sys
import tempfile


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"insert_collapse_check: {' '.join(command)} exited {result.returncode}: "
              f"{result.stderr.strip()}", file=sys.stderr)
        sys.exit(1)


def main():
    tandem, path, seed, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    generator = random.Random(seed)
    model = bytearray(generator.randbytes(100_000))
    with open(path, "wb") as handle:
        handle.write(model)
    source = tempfile.NamedTemporaryFile(delete=False)
    try:
        for step in range(steps):
            kind = generator.choice(["zeros", "data", "collapse"])
            if kind == "collapse" and len(model) > 0:
                offset = generator.randint(0, len(model) - 1)
                length = generator.randint(1, min(len(model) - offset, 20_000))
                run([tandem, "collapse", path, str(offset), str(length)])
                del model[offset:offset + length]
            elif kind == "zeros":
                offset = generator.randint(0, len(model))
                length = generator.randint(1, 10_000)
                run([tandem, "insert", path, str(offset), "--zeros", str(length)])
                model[offset:offset] = bytes(length)
            else:
                offset = generator.randint(0, len(model))
                data = generator.randbytes(generator.randint(1, 10_000))
                with open(source.name, "wb") as handle:
                    handle.write(data)
                run([tandem, "insert", path, str(offset), "--from", source.name])
                model[offset:offset] = data
            with open(path, "rb") as handle:
                contents = handle.read()
            if contents != bytes(model):
                print(f"insert_collapse_check: step {step} ({kind}): file has {len(contents)} "
                      f"bytes, model {len(model)}", file=sys.stderr)
                sys.exit(1)
    finally:
        os.unlink(source.name)
    # Leave the model beside the file so later checks (after remount) can compare again.
    with open(path + ".model", "wb") as handle:
        handle.write(model)


if __name__ == "__main__":
    main()
