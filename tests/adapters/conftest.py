import pytest

from atroposlib.testing.tiny_tokenizer import make_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_tokenizer")
    make_tiny_tokenizer(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_tok(tiny_tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tok_dir)
