# Shortcuts; each target does its own set-up (hack/setup.sh) on a fresh machine.
.PHONY: demo test lint ci images
demo:  ## run the agent on the built-in demo models
	hack/demo.sh
test:  ## run every test
	hack/test.sh
lint:  ## ruff, mypy --strict, import-linter
	hack/lint.sh
ci: lint test
images:  ## build both images (PUSH=1: and push): make images REGISTRY=registry/team TAG=0.1.0
	REGISTRY="$(REGISTRY)" TAG="$(TAG)" PUSH="$(PUSH)" CONTAINER="$(CONTAINER)" hack/images.sh
