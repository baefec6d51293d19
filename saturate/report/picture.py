"""The README's picture of a report: `saturate optimize MODEL --html` rendered by headless Chromium.

    python -m saturate.report.picture                      # rewrites saturate/report/report.png
    python -m saturate.report.picture --model example:resnet18 -o resnet18.png

Chromium (`apt-get install chromium`) draws the page; Pillow crops the empty space below it and
stores it with a small palette, which keeps the README's image well under 300 KB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from saturate.core.errors import SaturateError

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "report.png"
BACKGROUND_MARGIN = 24   # pixels kept below the page's last drawn row
COLORS = 256             # palette size: the page is flat colors and antialiased text; fewer merge its pale fills


def chromium() -> str | None:
    """The headless browser on the PATH, if any."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def screenshot(page: Path, out: Path, width: int, height: int, profile: Path) -> None:
    """A PNG of `page` as a window of width x height shows it."""
    browser = chromium()
    if browser is None:
        raise SaturateError("no chromium on the PATH: apt-get install chromium")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri()]
    # HOME in the scratch folder: Chromium writes its caches there, not in the user's home.
    done = subprocess.run(flags, env={**os.environ, "HOME": str(profile)}, capture_output=True, text=True,
                          timeout=180)
    if done.returncode != 0 or not out.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SaturateError(f"chromium could not draw {page}: {last}")


def trim_and_pack(shot: Path, out: Path) -> None:
    """Crop the background below the page's content, and save with a small palette."""
    from PIL import Image, ImageChops

    image = Image.open(shot).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box is None:
        raise SaturateError(f"{shot}: the page drew nothing")
    image = image.crop((0, 0, image.width, min(image.height, box[3] + BACKGROUND_MARGIN)))
    packed = image.quantize(colors=COLORS, method=Image.Quantize.FASTOCTREE)
    tmp = out.with_name(out.name + ".tmp")
    packed.save(tmp, format="PNG", optimize=True)
    os.replace(tmp, out)


def make_picture(model: str, out: Path, width: int = 1280, height: int = 4000) -> None:
    """Optimize `model` with --html through the CLI (a child process: the report stage sits
    below the commands), and write the page's picture to `out`."""
    with tempfile.TemporaryDirectory(prefix="saturate-picture-") as scratch:
        folder = Path(scratch)
        page = folder / "report.html"
        code = subprocess.run([sys.executable, "-m", "saturate", "optimize", model, "-o", str(folder / "model.onnx"),
                               "--html", str(page), "--quiet"]).returncode
        if code != 0:
            raise SaturateError(f"optimize {model} failed (exit {code})")
        shot = folder / "shot.png"
        screenshot(page, shot, width, height, folder / "profile")
        trim_and_pack(shot, out)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m saturate.report.picture", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="example:vgg", help="the model to optimize (default example:vgg)")
    parser.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT), help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280, help="window width in pixels (default 1280)")
    args = parser.parse_args(argv)
    try:
        make_picture(args.model, Path(args.output), args.width)
    except SaturateError as err:
        print(f"saturate: error: {err}", file=sys.stderr)
        return 2
    size = Path(args.output).stat().st_size
    print(f"wrote {args.output} ({size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(run())
