"""Start the web server, one Celery worker and the periodic scheduler; Ctrl-C stops all."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import CommandError

from backfill_portal.core.management.base import PortalCommand

from backfill_portal.web.management.commands.load_demo import demo_logins_note


FEED_SECONDS = 600  # the feed loads a day ahead; every ten minutes is plenty


class Command(PortalCommand):
    help = "Run web + worker + scheduler together (the embedded default deployment)."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=os.environ.get("PORTAL_ADDR", "127.0.0.1:8000"))

    def _feed(self) -> None:
        """The demo's live feed (web/demo/sources.py): today's source days, so the
        scheduler's production runs read real events. Only where `load_demo` ran; a
        failure is said in one line and tried again at the next feed."""
        from backfill_portal.backends import get_warehouse
        from backfill_portal.web.demo.sources import demo_sources_loaded, feed_demo_sources

        try:
            warehouse = get_warehouse()
            if demo_sources_loaded(warehouse):
                fed = feed_demo_sources(warehouse)
                if any(fed.values()):
                    self.stdout.write("demo feed: " + ", ".join(f"{k} +{v}" for k, v in fed.items()))
        except Exception as exc:  # noqa: BLE001 - the feed must not stop the portal
            self.stderr.write(f"demo feed: {exc}")

    def handle(self, *args, addr, **options):
        self._feed()  # before the scheduler's first tick
        python = sys.executable
        beat_schedule = str(settings.VAR_DIR / "celerybeat-schedule")
        commands = {
            "web": [python, "manage.py", "runserver", addr, "--noreload"],
            "worker": [python, "-m", "celery", "-A", "backfill_portal", "worker", "-Q", "production,backfill",
                       "--concurrency", os.environ.get("WORKER_CONCURRENCY", "2"), "--loglevel", "INFO"],
            "scheduler": [python, "-m", "celery", "-A", "backfill_portal", "beat", "--schedule", beat_schedule,
                          "--loglevel", "INFO"],
        }
        procs = {name: subprocess.Popen(cmd, cwd=settings.BASE_DIR) for name, cmd in commands.items()}
        self.stdout.write(self.style.SUCCESS(f"\nBackfill Portal: http://{addr}/  (API docs: http://{addr}/api/docs/)"))
        self.stdout.write(demo_logins_note() + "\nCtrl-C stops web, worker and scheduler.\n")
        stopping = False
        exited = None  # (name, code) of a process that stopped by itself

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        next_feed = time.monotonic() + FEED_SECONDS
        try:
            while not stopping:
                if time.monotonic() >= next_feed:
                    self._feed()
                    next_feed = time.monotonic() + FEED_SECONDS
                for name, proc in procs.items():
                    if not stopping and proc.poll() is not None:
                        exited = (name, proc.returncode)
                        stopping = True
                time.sleep(0.5)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.time() + 10
            for proc in procs.values():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    proc.kill()
        if exited is not None:
            raise CommandError(f"the {exited[0]} process exited with {exited[1]}; stopped the others")
