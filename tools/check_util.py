#!/usr/bin/env python3
"""check_util.py - the small computations the tools/check-* scripts share (through
tools/check-lib.sh's check_py): a field of a program's JSON line, float comparisons, the
generated training texts, safetensors files compared tensor by tensor, a bit flipped in a
file. One subcommand a call; a comparison answers with its exit status (0: true).

    check_util.py text chars SEED N       N characters of "abc de\\n" (random.Random(SEED))
    check_util.py text words SEED N       N words of a small vocabulary (random.seed(SEED))
    check_util.py field FILE|- KEY        KEY of the JSON object on FILE's last line
    check_util.py jfield FILE KEY         KEY of the JSON object that is all of FILE
    check_util.py close A B REL           |A - B| <= REL * |B|
    check_util.py within A B ABS          |A - B| <= ABS
    check_util.py less A B                A < B
    check_util.py atleast A B             A >= B
    check_util.py losses FILE             "step:loss" of every "step" line of a --log file
    check_util.py same-tensors A B        two safetensors files hold the same tensors, byte
                                          for byte (names, dtypes, shapes, data; the metadata
                                          may differ); says which differ
    check_util.py close-tensors A B TOL   two safetensors files of F32 tensors: the same
                                          names, every element within TOL
    check_util.py flip FILE OFFSET MASK   XOR the byte at OFFSET (negative: from the end)
"""
import json
import random
import struct
import sys


def last_line_json(path):
    text = sys.stdin.read() if path == "-" else open(path).read()
    lines = text.splitlines()
    return json.loads(lines[-1] if lines else "")


def tensors(path):
    """name -> (dtype, shape, raw bytes) of a safetensors file, its metadata left out"""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def text(kind, seed, n):
    if kind == "chars":
        r = random.Random(seed)
        return "".join(r.choice("abc de\n") for _ in range(n))
    random.seed(seed)
    words = ["in", "the", "beginning", "god", "created", "heaven", "and", "earth"]
    return " ".join(random.choice(words) for _ in range(n))


def same_tensors(pa, pb):
    a, b = tensors(pa), tensors(pb)
    if a.keys() != b.keys():
        sys.exit("different tensors: %s" % sorted(set(a) ^ set(b)))
    diff = [k for k in a if a[k] != b[k]]
    if diff:
        sys.exit("%d tensors differ, e.g. %s" % (len(diff), diff[:3]))


def close_tensors(pa, pb, tol):
    def floats(path):
        out = {}
        for k, (dtype, _, raw) in tensors(path).items():
            assert dtype == "F32", (k, dtype)
            out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
        return out
    a, b = floats(pa), floats(pb)
    if a.keys() != b.keys():
        sys.exit("other tensors: %s" % sorted(set(a) ^ set(b)))
    worst = max((max(abs(x - y) for x, y in zip(a[k], b[k])), k) for k in b)
    sys.exit(0 if worst[0] <= tol else "%s differs by %.3g" % (worst[1], worst[0]))


def flip(path, offset, mask):
    b = bytearray(open(path, "rb").read())
    b[offset] ^= mask
    open(path, "wb").write(b)


def main(argv):
    cmd, args = argv[0], argv[1:]
    if cmd == "text":
        print(text(args[0], int(args[1]), int(args[2])))
    elif cmd == "field":
        print(last_line_json(args[0])[args[1]])
    elif cmd == "jfield":
        print(json.load(open(args[0]))[args[1]])
    elif cmd in ("close", "within", "less", "atleast"):
        a, b = float(args[0]), float(args[1])
        ok = {"close": lambda: abs(a - b) <= float(args[2]) * abs(b),
              "within": lambda: abs(a - b) <= float(args[2]),
              "less": lambda: a < b,
              "atleast": lambda: a >= b}[cmd]()
        sys.exit(0 if ok else 1)
    elif cmd == "losses":
        print(" ".join("%d:%.6f" % (l["step"], l["loss"]) for l in map(json.loads, open(args[0]))
                       if l["type"] == "step"))
    elif cmd == "same-tensors":
        same_tensors(args[0], args[1])
    elif cmd == "close-tensors":
        close_tensors(args[0], args[1], float(args[2]))
    elif cmd == "flip":
        flip(args[0], int(args[1]), int(args[2]))
    else:
        sys.exit("check_util.py: no subcommand %r (see its opening comment)" % cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
