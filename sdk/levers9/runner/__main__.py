from levers9.runner.main import run

run()
