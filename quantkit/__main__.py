from quantkit.cli import run

run()
