# Shortcuts; each target does its own set-up (hack/setup.sh) on a fresh machine.
.PHONY: demo test lint ci images
PORT ?= 8080
demo:  ## run the agent on the demo models (make demo PORT=9000 for another port)
	PORT=$(PORT) hack/demo.sh
test:  ## run every test
	hack/test.sh
lint:  ## ruff, mypy --strict, import-linter
	hack/lint.sh
ci: lint test
images:  ## build both images (PUSH=1: and push): make images REGISTRY=registry/team TAG=0.1.0
	REGISTRY="$(REGISTRY)" TAG="$(TAG)" PUSH="$(PUSH)" CONTAINER="$(CONTAINER)" hack/images.sh
