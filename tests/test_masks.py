"""completion_mask: every token up to and including the first EOS, never after."""

import pytest
import torch

from comlrl.algorithms.masks import completion_mask

EOS = 2
CASES = {
    # ids, eos ids, expected mask (1 = counts)
    "eos_in_middle": ([5, 6, EOS, 0, 0], [EOS], [1, 1, 1, 0, 0]),
    "eos_last": ([5, 6, 7, 8, EOS], [EOS], [1, 1, 1, 1, 1]),
    "no_eos_truncated": ([5, 6, 7, 8, 9], [EOS], [1, 1, 1, 1, 1]),
    "eos_first": ([EOS, 5, 6, 7, 8], [EOS], [1, 0, 0, 0, 0]),
    # the tokens after the first EOS never count, even if another EOS or real ids follow
    "second_eos_after": ([5, EOS, 6, EOS, 7], [EOS], [1, 1, 0, 0, 0]),
    "padding_equals_eos": ([5, EOS, EOS, EOS, EOS], [EOS], [1, 1, 0, 0, 0]),
    # several EOS ids: whichever comes first ends the completion
    "multi_eos_first_id": ([5, 3, 6, EOS, 0], [EOS, 3], [1, 1, 0, 0, 0]),
    "multi_eos_second_id": ([5, 6, EOS, 3, 0], [3, EOS], [1, 1, 1, 0, 0]),
    "multi_eos_none": ([5, 6, 7, 8, 9], [EOS, 3], [1, 1, 1, 1, 1]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_single_rows(name):
    ids, eos_ids, expected = CASES[name]
    got = completion_mask(torch.tensor([ids]), eos_ids)
    assert got.dtype == torch.bool
    assert got.int().tolist() == [expected]


def test_batch_rows_are_independent():
    names = list(CASES)
    for eos_ids in ([EOS], [EOS, 3]):
        rows = [n for n in names if CASES[n][1] == eos_ids]
        ids = torch.tensor([CASES[n][0] for n in rows])
        got = completion_mask(ids, eos_ids)
        assert got.int().tolist() == [CASES[n][2] for n in rows]


def test_eos_ids_as_tuple_and_tensor():
    ids = torch.tensor([[5, EOS, 6]])
    for eos_ids in ((EOS,), torch.tensor([EOS])):
        assert completion_mask(ids, eos_ids).int().tolist() == [[1, 1, 0]]
