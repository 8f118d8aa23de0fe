#!/usr/bin/env python3
"""Runs the example commands shown in README.md and docs/*.md and checks (or rewrites) their output.

An example is a fenced ```console block preceded by a marker line:

    <!-- example: NAME -->
    ```console
    $ trainplan predict --model gpt2 ... \\
        --json p.json
    ...output...
    ```

Each line starting with "$ " is a shell command (a line ending in a backslash continues on the
next one); the lines after it, up to the next command or the end of the block, are its output
(stdout and stderr together). The commands of one block run in order with bash, in one fresh
scratch folder holding a link `tests` to the repository's tests/ folder (so `tests/data/...`
paths work), with the `trainplan` under test first on PATH and TRAINPLAN_DATA_DIR set to this
checkout. A command that exits non-zero is shown as it is; to show the exit status write
`; echo "exit $?"` after it.

Markers may carry options after the name:
    needs=exec   the example runs `trainplan exec|calibrate` (LibTorch): skipped, with a line
                 saying so, when trainplan-exec is not built beside trainplan.

Figures that differ from run to run (elapsed times, thread counts, the scratch folder's and the
repository's paths, shown as <scratch> and <repo>) are replaced by fixed placeholders (MASKS below) in both the stored and the fresh output.

  readme_examples.py --trainplan build/trainplan [--root .] [--update] [FILE.md...]

Without --update: exit 1 and a diff for each example whose output drifted, or for any ```console
block whose commands carry no marker (an example nobody checks). With --update: rewrite the
outputs in place. Exit 2 on a malformed example.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

MARKER = re.compile(r"^<!-- example: ([A-Za-z0-9_.-]+)((?: [a-z]+=[A-Za-z0-9_.-]+)*) -->$")
FENCE_OPEN = "```console"
FENCE_CLOSE = "```"

# (pattern, replacement): what varies between runs of the same command on the same input.
MASKS = [
    # search: "... in 8.11 ms on 2 threads:" -- the wall time and the machine's core count
    (re.compile(r" in [0-9.]+ (?:ns|us|ms|s) on [0-9]+ threads?"), " in <elapsed> on <threads>"),
    # capacity: "(14 searches in 20.11 ms)"
    (re.compile(r"searches in [0-9.]+ (?:ns|us|ms|s)\)"), "searches in <elapsed>)"),
    (re.compile(r"search in [0-9.]+ (?:ns|us|ms|s)\)"), "search in <elapsed>)"),
]


def mask(text):
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


class Example:
    def __init__(self, path, name, options, start, end, commands):
        self.path = path          # the markdown file
        self.name = name
        self.options = options    # dict from the marker
        self.start = start        # index of the line after the opening fence
        self.end = end            # index of the closing fence
        self.commands = commands  # [(command lines as shown, stored output lines)]


def bad(path, line, why):
    sys.stderr.write(f"readme_examples: {path}:{line + 1}: {why}\n")
    sys.exit(2)


def parse_block(path, lines, start, end):
    commands = []
    i = start
    while i < end:
        if not lines[i].startswith("$ "):
            bad(path, i, "an example block must start with a '$ ' command line")
        shown = [lines[i]]
        while shown[-1].endswith("\\"):
            i += 1
            if i >= end:
                bad(path, i, "a command continues past the end of its block")
            shown.append(lines[i])
        i += 1
        out_start = i
        while i < end and not lines[i].startswith("$ "):
            i += 1
        commands.append((shown, lines[out_start:i]))
    return commands


def parse(path):
    """The examples of one markdown file, and the line numbers of unmarked console blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    examples, unmarked = [], []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            if i + 1 >= len(lines) or lines[i + 1] != FENCE_OPEN:
                bad(path, i, f"example {m.group(1)}: the marker must be followed by a {FENCE_OPEN} line")
            end = i + 2
            while end < len(lines) and lines[end] != FENCE_CLOSE:
                end += 1
            if end == len(lines):
                bad(path, i, f"example {m.group(1)}: block never closed")
            options = dict(o.split("=", 1) for o in m.group(2).split())
            examples.append(Example(path, m.group(1), options, i + 2, end,
                                    parse_block(path, lines, i + 2, end)))
            i = end + 1
            continue
        if lines[i] == FENCE_OPEN:
            unmarked.append(i + 1)
        elif lines[i].startswith("```"):
            # Skip the body of any other fenced block, so its lines are not taken for markers.
            i += 1
            while i < len(lines) and lines[i] != FENCE_CLOSE:
                i += 1
        i += 1
    return lines, examples, unmarked


def run_example(example, trainplan, root):
    """The fresh output lines of each command of the example, masked."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(os.path.abspath(trainplan)) + os.pathsep + env.get("PATH", "")
    env["TRAINPLAN_DATA_DIR"] = root
    env["LC_ALL"] = "C.UTF-8"
    env.pop("COLUMNS", None)
    results = []
    with tempfile.TemporaryDirectory(prefix="trainplan-example-") as scratch:
        os.symlink(os.path.join(root, "tests"), os.path.join(scratch, "tests"))
        for shown, _ in example.commands:
            script = "\n".join(shown)[2:]  # drop the "$ "; bash joins the backslash lines itself
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", script], cwd=scratch, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=120)
            text = proc.stdout.decode("utf-8", errors="replace")
            text = text.replace(scratch, "<scratch>").replace(root, "<repo>")
            out = mask(text).split("\n")
            if out and out[-1] == "":
                out.pop()
            results.append(out)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainplan", required=True, help="the trainplan binary under test")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the repository (default: this script's)")
    parser.add_argument("--update", action="store_true", help="rewrite the stored outputs")
    parser.add_argument("files", nargs="*", help="markdown files (default: README.md, docs/*.md)")
    args = parser.parse_args()
    args.trainplan = os.path.abspath(args.trainplan)
    if not (os.path.isfile(args.trainplan) and os.access(args.trainplan, os.X_OK)):
        parser.error(f"--trainplan {args.trainplan}: not an executable file")
    root = os.path.abspath(args.root)
    files = args.files or [os.path.join(root, "README.md")] + sorted(
        os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    has_exec = os.access(os.path.join(os.path.dirname(os.path.abspath(args.trainplan)), "trainplan-exec"), os.X_OK)

    failures, checked, skipped, names = 0, 0, 0, set()
    for path in files:
        lines, examples, unmarked = parse(path)
        rel = os.path.relpath(path, root)
        for line in unmarked:
            print(f"{rel}:{line}: a {FENCE_OPEN} block without an '<!-- example: NAME -->' marker")
            failures += 1
        # Rewrite from the last example up, so earlier line numbers stay valid.
        for example in reversed(examples):
            if example.name in names:
                bad(path, example.start - 2, f"example name {example.name} used twice")
            names.add(example.name)
            if example.options.get("needs") == "exec" and not has_exec:
                print(f"{rel}: example {example.name}: skipped (trainplan-exec not built)")
                skipped += 1
                continue
            fresh = run_example(example, args.trainplan, root)
            new_body = []
            for (shown, _), out in zip(example.commands, fresh):
                new_body += shown + out
            old_body = lines[example.start:example.end]
            checked += 1
            if mask("\n".join(old_body)) == "\n".join(new_body):
                continue
            if args.update:
                lines[example.start:example.end] = new_body
                print(f"{rel}: example {example.name}: updated")
            else:
                failures += 1
                print(f"{rel}: example {example.name}: output drifted (run {os.path.basename(__file__)} --update):")
                sys.stdout.writelines(difflib.unified_diff(
                    [l + "\n" for l in old_body], [l + "\n" for l in new_body],
                    f"{rel} (stored)", f"{rel} (fresh)", n=1))
        if args.update:
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
    print(f"readme_examples: {checked} examples run, {skipped} skipped, {failures} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
