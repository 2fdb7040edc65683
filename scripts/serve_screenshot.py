"""screenshots/serve-browser.png: `fleet-tui serve` in headless chromium, with workers running.

    FLEET_TEST_CLAUDE=$PWD/.claude-cli/node_modules/.bin/claude \
        .venv/bin/python scripts/serve_screenshot.py

The real claude against the scripted endpoint, three tasks launched, the page opened from
the printed link; the shot is taken once the page's terminal shows a finished task and a
running one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support")]

from serve_support import new_browser, serve, wait_screen  # noqa: E402
from test_ui_support import QUICK_SCRIPTS  # noqa: E402

from bench.common import bench_env, make_repo  # noqa: E402
from fleet_tui.demo.endpoint import ScriptedEndpoint  # noqa: E402

OUT = ROOT / "screenshots" / "serve-browser.png"


def main() -> int:
    claude = os.environ.get("FLEET_TEST_CLAUDE")
    if not claude:
        sys.stderr.write("set FLEET_TEST_CLAUDE to the pinned claude binary\n")
        return 2
    with bench_env() as benv, ScriptedEndpoint(QUICK_SCRIPTS) as endpoint:
        repo = make_repo(benv.root / "shop")
        env = {**benv.env, "FLEET_WORKER_BASE_URL": endpoint.url, "FLEET_WORKER_CLAUDE": claude,
               "FLEET_WORKER_KEY_SOURCES": "env", "ANTHROPIC_AUTH_TOKEN": "screenshot-key",
               "CLAUDE_CODE_MAX_RETRIES": "0"}
        if os.geteuid() == 0:
            env["FLEET_WORKER_SANDBOX"] = "1"
        from fleet_tui.engine.fleet import Fleet
        from fleet_tui.settings.config import load_settings
        from fleet_tui.store.db import TaskSpec

        os.environ.update(env)
        fleet = Fleet(load_settings())
        for prompt, title in (("Write hello.txt", "Say hello in a file"),
                              ("[script:slow] run the long suite", "Run the long test suite"),
                              ("[script:second] add second.txt", "Add a second file")):
            fleet.submit(TaskSpec(prompt=prompt, title=title, repo=repo))
        with serve(env, repo, "--repo", str(repo)) as srv:
            driver = new_browser()
            try:
                driver.set_window_size(1280, 760)
                driver.get(srv.link)
                wait_screen(driver, "succeeded", timeout=90)
                wait_screen(driver, "running", timeout=90)
                wait_screen(driver, "done in", timeout=90)
                driver.save_screenshot(str(OUT))
            finally:
                driver.quit()
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
