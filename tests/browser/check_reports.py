#!/usr/bin/env python3
"""Browser test of trainplan's HTML reports, run by ctest.

Makes one report of each kind with the built trainplan (predict, simulate, search, capacity,
compare, a measured run), opens each in headless Chromium through the DevTools protocol (over
--remote-debugging-pipe: no port, no websocket library) at a desktop (1280 px) and a phone
(390 px) width, and fails on:
  - any console error, uncaught exception or browser log entry of level "error";
  - any request other than the page itself (a report is self-contained), and any failed load;
  - a page wider than the window (it must reflow to the phone width);
  - a blank screenshot: the luminance of the screenshot must vary (standard deviation > 8 on a
    0..255 scale, and more than 2% of the pixels darker than the background);
  - an axis name drawn over a tick label of its chart (their boxes intersect);
  - page-specific text (PAGE_TEXT): the capacity page must state the price per GPU-hour and
    whether it is assumed, the goodput and the energy, and print no figure as an exponent.
Exit 77 (ctest: skipped) with a line saying why when Chromium is not installed.

  check_reports.py --trainplan build/trainplan --data tests/data --out DIR [--screenshots DIR]
  check_reports.py --out DIR --expect-problems PAGE.html...

--expect-problems checks the checker: each page given must be reported with a problem (exit 0
then, 1 when one passes), e.g. tests/browser/bad_page.html.

--screenshots DIR also writes full-page PNGs at 1280 px of the search and the predicted-vs-
measured reports (the README's pictures).
"""
import argparse
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

SKIP = 77
WIDTHS = {"desktop": 1280, "phone": 390}


def find_chromium():
    # Debian's /usr/bin/chromium is a shell wrapper around this binary.
    if os.access("/usr/lib/chromium/chromium", os.X_OK):
        return "/usr/lib/chromium/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium driven over --remote-debugging-pipe (fd 3: commands in, fd 4: replies
    out, each message JSON ended by a NUL byte)."""

    def __init__(self, exe, profile_dir, log_path):
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire():  # in the child, before exec: the pipe ends at fds 3 and 4 (either may be 3 or 4 now)
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
                "--user-data-dir=" + profile_dir]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(args + ["about:blank"], stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=self._log, close_fds=False, preexec_fn=wire)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next_id = 0
        self.events = []

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        self._log.close()

    def _read_message(self, deadline):
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from Chromium")
            import select
            ready, _, _ = select.select([self._from_child], [], [], 0.5)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe (see its log)")
                self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=None, timeout=30):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method, session, timeout=30):
        deadline = time.monotonic() + timeout
        for i, e in enumerate(self.events):
            if e.get("method") == method and e.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            e = self._read_message(deadline)
            if e.get("method") == method and e.get("sessionId") == session:
                return e
            self.events.append(e)


def problems_in(events, page_url):
    """Console errors, exceptions, error log entries, failed loads and requests other than the page."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:300])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log error: " + p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
        elif m == "Network.loadingFailed":
            out.append("failed load: " + p.get("errorText", "") + " (request " + p.get("requestId", "") + ")")
        elif m == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if url != page_url and not url.startswith("data:"):
                out.append("request: " + url)
    return out


def png_luminance(png):
    """Luminance samples (0..255) of a PNG: PIL when installed, else a small decoder (8-bit RGB/RGBA,
    not interlaced, as Chromium writes them), every 4th pixel of every 4th row."""
    try:
        from PIL import Image
        import io
        img = Image.open(io.BytesIO(png)).convert("L")
        img = img.resize((max(1, img.width // 4), max(1, img.height // 4)))
        return list(img.getdata())
    except ImportError:
        pass
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", data)
            if depth != 8 or color not in (2, 6) or interlace:
                raise ValueError(f"PNG kind not decoded here (depth {depth}, colour {color})")
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += data
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    samples = []
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 255
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 255
        if y % 4 == 0:
            for x in range(0, width, 4):
                r, g, bl = line[x * bpp:x * bpp + 3]
                samples.append((299 * r + 587 * g + 114 * bl) // 1000)
        prev = line
    return samples


def blank_reason(png):
    """Why a screenshot looks blank, or None: luminance must vary and some pixels must be ink."""
    lum = png_luminance(png)
    n = len(lum)
    mean = sum(lum) / n
    sd = (sum((v - mean) ** 2 for v in lum) / n) ** 0.5
    background = max(set(lum), key=lum.count)
    ink = sum(1 for v in lum if v < background - 40) / n
    if sd <= 8 or ink <= 0.02:
        return f"blank screenshot (luminance stdev {sd:.1f}, {100 * ink:.1f}% ink)"
    return None


MIN_CHART_PX = 560

# Text a page must show (its visible text, document.body.innerText) and must not.
PAGE_TEXT = {
    "capacity": {"must": ["per GPU-hour", "(assumed)", "(--price)", "goodput", "energy MWh", "comparison", "15T"],
                 "must_not": ["e+", "e-0"]},
}

# The axis names whose box intersects a tick label's box in the same chart.
OVERLAP_JS = """JSON.stringify(Array.from(document.querySelectorAll('figure > svg')).flatMap(svg => {
  const ticks = Array.from(svg.querySelectorAll('text.tick'), t => t.getBoundingClientRect());
  return Array.from(svg.querySelectorAll('text.axis-label')).filter(l => {
    const a = l.getBoundingClientRect();
    return ticks.some(b => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom);
  }).map(l => l.textContent);
}))"""


def page_problems(browser, session, name):
    """Axis names over tick labels, and PAGE_TEXT's rules for this page."""
    ev = lambda expr: browser.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                                   session=session)["result"]["value"]
    problems = [f"axis name over a tick label: {t}" for t in json.loads(ev(OVERLAP_JS))]
    rules = PAGE_TEXT.get(name)
    if rules:
        text = ev("document.body.innerText")
        problems += [f"page does not say {t!r}" for t in rules["must"] if t not in text]
        problems += [f"page shows {t!r}" for t in rules["must_not"] if t in text]
    return problems


def open_page(browser, path, width, full_page, scale=1.0, name=""):
    """Opens `path` at `width` px; returns (problems, png bytes of the screenshot at `scale`)."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.send(domain + ".enable", session=session)
    browser.send("Emulation.setDeviceMetricsOverride",
                 {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": width < 600}, session=session)
    url = "file://" + os.path.abspath(path)
    browser.events.clear()
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_for("Page.loadEventFired", session)
    metrics = browser.send("Runtime.evaluate", {
        "expression": "JSON.stringify([document.documentElement.scrollWidth, window.innerWidth, "
                      "document.documentElement.scrollHeight, document.querySelectorAll('svg').length, "
                      "Math.min(...Array.from(document.querySelectorAll('figure > svg'), "
                      "s => s.getBoundingClientRect().width))])",
        "returnByValue": True}, session=session)["result"]["value"]
    scroll_w, inner_w, height, svgs, narrowest = json.loads(metrics)
    time.sleep(0.2)  # let late console messages arrive
    browser.send("Runtime.evaluate", {"expression": "1"}, session=session)
    problems = problems_in([e for e in browser.events if e.get("sessionId") == session], url)
    if scroll_w > inner_w:
        problems.append(f"page is {scroll_w} px wide in a {inner_w} px window")
    if svgs == 0:
        problems.append("no chart (svg) on the page")
    # A chart drawn narrower than this shrinks its 12 px labels below legibility; a phone scrolls it.
    if narrowest is not None and narrowest < MIN_CHART_PX:
        problems.append(f"a chart is drawn {narrowest:.0f} px wide (text unreadable below {MIN_CHART_PX} px)")
    problems += page_problems(browser, session, name)
    clip_h = min(height, 12000) if full_page else 900
    shot = browser.send("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": full_page,
        "clip": {"x": 0, "y": 0, "width": width, "height": clip_h, "scale": scale}}, session=session)
    browser.send("Target.closeTarget", {"targetId": target})
    return problems, base64.b64decode(shot["data"])


def run(cmd, ok=(0,)):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode not in ok:
        sys.exit(f"browser test: {' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")


def make_reports(tp, data, out):
    """One report of each kind; returns {name: html path}."""
    cmp_dir = os.path.join(data, "compare")
    j = lambda n: os.path.join(out, n)
    run([tp, "predict", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8", "--pp", "4",
         "--global-batch", "512", "--html", j("predict.html")], ok=(0, 3))
    run([tp, "simulate", "--model", "gpt2", "--cluster", "dgx-a100-80g", "--gpus", "8", "--pp", "4",
         "--global-batch", "32", "--html", j("simulate.html")])
    run([tp, "search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "256",
         "--json", j("search.json"), "--html", j("search.html")])
    # The buyer's comparison of the README: four clusters, a deadline, a budget and one price given.
    run([tp, "capacity", "--model", "llama3-70b", "--tokens", "15T", "--clusters", "dgx-h100,dgx-b200,gb200-nvl72,mi300x",
         "--gpus-range", "512..4096", "--deadline-days", "90", "--budget-usd", "20000000", "--price", "mi300x=2.1",
         "--html", j("capacity.html")])
    run([tp, "compare", os.path.join(cmp_dir, "prediction_pp2.json"), os.path.join(cmp_dir, "measurement_pp2.json"),
         "--html", j("compare.html")])
    run([tp, "report", os.path.join(cmp_dir, "measurement_pp2.json"), "--html", j("measurement.html")])
    # The README's predicted-vs-measured picture: a measured H200 run of `trainplan exec` and
    # trainplan's prediction of it under the profile that describes that executor.
    h200 = os.path.join(data, "h200", "trainplan_exec", "xl-mb4.meas.json")
    if os.path.exists(h200):
        run([tp, "predict", "--model", "gpt2-xl", "--cluster", "dgx-h200", "--gpus", "1", "--micro-batch", "4",
             "--global-batch", "32", "--seq", "1024", "--software", "trainplan-exec", "--json", j("xl-pred.json")],
            ok=(0, 3))
        run([tp, "compare", j("xl-pred.json"), h200, "--html", j("h200-compare.html")])
    return {os.path.splitext(f)[0]: j(f) for f in sorted(os.listdir(out)) if f.endswith(".html")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trainplan")
    ap.add_argument("--data", help="tests/data")
    ap.add_argument("--out", required=True)
    ap.add_argument("--screenshots", help="write README screenshots here")
    ap.add_argument("--expect-problems", nargs="+", metavar="PAGE")
    a = ap.parse_args()
    if not a.expect_problems and not (a.trainplan and a.data):
        ap.error("needs --trainplan and --data (or --expect-problems)")
    exe = find_chromium()
    if not exe:
        print("browser test: skipped: Chromium is not installed (cmake/install-deps.sh installs the Debian "
              "package chromium; it could not here)")
        return SKIP
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    if a.expect_problems:
        pages = {os.path.basename(p): p for p in a.expect_problems}
    else:
        pages = make_reports(a.trainplan, a.data, a.out)
    failures = []
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(exe, profile, os.path.join(a.out, "chromium.log"))
        try:
            browser.send("Target.setDiscoverTargets", {"discover": False})
            for name, path in pages.items():
                for label, width in WIDTHS.items():
                    # Half scale: enough pixels to tell a drawn page from a blank one, 4x less to decode.
                    problems, png = open_page(browser, path, width, full_page=False, scale=0.5, name=name)
                    shot = os.path.join(a.out, f"{name}-{label}.png")
                    with open(shot, "wb") as f:
                        f.write(png)
                    reason = blank_reason(png)
                    if reason:
                        problems.append(reason)
                    print(f"{name:<14} {width:>5} px: {'ok' if not problems else '; '.join(problems)}")
                    failures += [f"{name} at {width} px: {p}" for p in problems]
                if a.screenshots and name in ("search", "h200-compare"):
                    os.makedirs(a.screenshots, exist_ok=True)
                    _, png = open_page(browser, path, 1280, full_page=True)
                    with open(os.path.join(a.screenshots, f"report-{name}.png"), "wb") as f:
                        f.write(png)
        finally:
            browser.close()
    if a.expect_problems:
        missed = [n for n in pages if not any(f.startswith(n + " at ") for f in failures)]
        if missed:
            print("browser test: the checker found no problem in " + ", ".join(missed))
            return 1
        print("browser test: the checker reported every bad page")
        return 0
    if failures:
        print("browser test: FAILED\n  " + "\n  ".join(failures))
        return 1
    print(f"browser test: {len(pages)} reports x {len(WIDTHS)} widths ok in {exe}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
