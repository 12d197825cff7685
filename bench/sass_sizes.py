"""SASS instructions per kernel of the built extension (cuobjdump), largest first: the instruction-cache footprint
that a launch's blocks fetch. Usage: python3 bench/sass_sizes.py [REGEX] (default: every kernel)."""
import glob
import re
import subprocess
import sys


def sizes(path):
    sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    counts, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            name = m.group(1)
            counts[name] = 0
        elif name and re.match(r"\s+/\*[0-9a-f]{4,}\*/", line):
            counts[name] += 1
    return counts


def main():
    pattern = re.compile(sys.argv[1] if len(sys.argv) > 1 else ".")
    path = glob.glob("replayssm/_C*.so")[0]
    demangled = {}
    counts = sizes(path)
    names = list(counts)
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    demangled = dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if pattern.search(demangled[name]):
            print(f"{n:7d}  {demangled[name][:160]}")


if __name__ == "__main__":
    main()
