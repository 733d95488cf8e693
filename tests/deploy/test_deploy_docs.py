"""Every command in docs/deploy/ is one the project can stand behind: each `jaxpaged ...` line (and each `docker run`
of the images, whose arguments go to `jaxpaged serve`) parses with the real command-line parser, each
`pip install` names extras pyproject.toml has, each curl asks a route the server has, each file a command or a link
names exists. Nothing is started."""

import pathlib
import re
import tomllib

import pytest

from jaxpaged.cli import build_parser
from jaxpaged.server.launcher import model_argument
from tests.deploy.doc_commands import command_lines, jaxpaged_invocations, shell_blocks
from tests.deploy.dockerfile import read_stages

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY_DOCS = sorted((ROOT / "docs" / "deploy").glob("*.md"))
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
ROUTES = set(re.findall(r'@app\.(?:get|post)\("([^"]+)"\)', (ROOT / "jaxpaged/server/app.py").read_text()))
IMAGE = re.compile(r"(?:^|/)jaxpaged:(tpu|cuda)$")


def commands(doc: pathlib.Path) -> list[list[str]]:
    return [words for block in shell_blocks(doc.read_text()) for words in command_lines(block)]


def parse(argv: list[str], where: str):
    """The parsed flags of a `jaxpaged` argv; a test failure naming the doc and the line when argparse rejects it."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: `jaxpaged {' '.join(argv)}` is rejected by the command-line parser")
    if args.command == "serve":
        model_argument(args)  # a model given twice, differently, raises
    return args


def test_the_deploy_docs_exist_and_the_readme_links_them():
    assert {doc.name for doc in DEPLOY_DOCS} >= {"tpu-vm.md", "multi-host.md", "gke.md", "gpu.md"}
    assert "docs/deploy/" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda doc: doc.name)
def test_every_jaxpaged_command_parses(doc):
    invocations = [argv for words in commands(doc) for argv in jaxpaged_invocations(words)]
    if doc.name != "gke.md":  # gke.md's commands live in the manifests (test_gke_manifests.py)
        assert invocations, f"{doc.name} shows no jaxpaged command"
    for argv in invocations:
        parse(argv, doc.name)


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda doc: doc.name)
def test_docker_run_arguments_parse_after_the_images_entry_point(doc):
    for words in commands(doc):
        images = [(index, match) for index, match in enumerate(map(IMAGE.search, words)) if match is not None]
        if words[:2] != ["docker", "run"] or not images:
            continue
        index, match = images[0]
        entrypoint = read_stages(ROOT / "docker" / f"Dockerfile.{match.group(1)}")[-1].last("ENTRYPOINT").exec_form()
        args = parse([*entrypoint[1:], *words[index + 1:]], doc.name)
        assert args.host == "0.0.0.0"


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda doc: doc.name)
def test_pip_installs_name_real_extras_and_files(doc):
    for words in commands(doc):
        for word in words:
            match = re.fullmatch(r"jaxpaged\[([\w,]+)\]", word)
            if match:
                assert set(match.group(1).split(",")) <= EXTRAS, f"{doc.name}: {word}"
        if "-c" in words:
            assert (ROOT / words[words.index("-c") + 1]).is_file(), f"{doc.name}: {' '.join(words)}"


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda doc: doc.name)
def test_named_files_and_links_exist(doc):
    text = doc.read_text()
    for path in re.findall(r"\b((?:deploy/gke|docker)/[\w./-]+?\.(?:yaml|tpu|cuda))\b", text):
        assert (ROOT / path).is_file(), f"{doc.name} names {path}"
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (doc.parent / target).exists(), f"{doc.name} links {target}"


@pytest.mark.parametrize("doc", DEPLOY_DOCS, ids=lambda doc: doc.name)
def test_curl_asks_routes_the_server_has(doc):
    for words in commands(doc):
        if words[:1] != ["curl"]:
            continue
        urls = [word for word in words if word.startswith("http://")]
        assert urls, f"{doc.name}: {' '.join(words)}"
        path = "/" + urls[0].split("/", 3)[3]
        assert path in ROUTES, f"{doc.name}: {path} is not one of the server's routes {sorted(ROUTES)}"


def test_invocations_are_found_inside_quoted_remote_commands():
    words = command_lines('gcloud ssh vm --worker=all --command="X=1 ~/v/bin/jaxpaged serve m -tp 4 && echo"\n')[0]
    assert jaxpaged_invocations(words) == [["serve", "m", "-tp", "4"]]
    assert command_lines("jaxpaged serve \\\n  --port 1  # comment\n# only a comment\n") == [
        ["jaxpaged", "serve", "--port", "1"]]
