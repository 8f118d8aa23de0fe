"""Rewrites the measured arrays (gemm, attention, memory_bound) of a topology's "ops" object in place
from make_ops_table.py's output, keeping the rest of the file's text (and its layout) as it is.

usage: python3 splice_ops.py TOPOLOGY.json OPS.json "SENTENCE TO APPEND TO ops.source"
"""
import json, sys

path, ops_path, note = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
new = json.load(open(ops_path))
start = text.index('    "gemm": [')
end = text.index('\n  },\n', start)  # end of the "ops" object


def row(d):
    return "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in d.items()) + "}"


lines = ['    "gemm": [', ",\n".join("      " + row(g) for g in new["gemm"]), "    ],",
         '    "attention": [', ",\n".join("      " + row(a) for a in new["attention"]), "    ],",
         '    "memory_bound": {']
mem = []
for name, pts in new["memory_bound"].items():
    mem.append(f'      "{name}": [\n' + ",\n".join("        " + row(p) for p in pts) + "\n      ]")
lines += [",\n".join(mem), "    }"]
text = text[:start] + "\n".join(lines) + text[end:]
# append the note to ops.source
o = text.index('"ops": {')
s = text.index('"source": "', o) + len('"source": "')
e = s
while True:
    e = text.index('"', e)
    if text[e - 1] != "\\":
        break
    e += 1
text = text[:e] + note + text[e:]
check = json.loads(text)["ops"]
for k in ("gemm", "attention", "memory_bound"):
    assert check[k] == new[k], k
open(path, "w").write(text)
