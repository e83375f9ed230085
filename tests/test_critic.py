"""Actor-critic pieces against hand computations: GAE's lambda-returns over a rollout tree,
whitening, the clipped value loss, explained variance, entropy; and a critic that learns."""

import pytest
import torch

from comlrl.algorithms import policy_gradient_loss, token_weights
from comlrl.algorithms.critic import clipped_value_loss, whiten
from comlrl.algorithms.logprobs import token_entropy
from comlrl.algorithms.returns import tree_lambda_returns, tree_returns
from comlrl.models.value import Critic, ValueHead, hidden_size
from comlrl.utils.stats import explained_variance

from .helpers import char_tokenizer, tiny_gpt2

NO_CHILD = torch.tensor([[-1]])


def test_lambda_returns_of_a_chain_are_textbook_gae():
    # One agent, one joint action per node: the tree is a chain of 3 turns.
    rewards = [torch.tensor([[[1.0]]]), torch.tensor([[[2.0]]]), torch.tensor([[[3.0]]])]
    children = [torch.tensor([[0]]), torch.tensor([[0]]), NO_CHILD]
    values = [torch.tensor([[0.5]]), torch.tensor([[1.0]]), torch.tensor([[1.5]])]
    gamma, lam = 0.9, 0.8
    # By hand: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}, G = A + V
    # delta = (1.4, 2.35, 1.5); A = (3.8696, 3.43, 1.5); G = (4.3696, 4.43, 3.0)
    returns = tree_lambda_returns(rewards, children, values, gamma, lam)
    torch.testing.assert_close(torch.stack([g.reshape(()) for g in returns]), torch.tensor([4.3696, 4.43, 3.0]))


def test_lambda_returns_of_a_tree_bootstrap_from_the_child_node_mean():
    # Turn 1: one node, 2 joint actions, 2 agents; joint action 0 starts turn 2's node 0,
    # joint action 1 ended its branch. Turn 2: one node, 2 joint actions.
    rewards = [torch.tensor([[[1.0, 0.0], [0.0, 2.0]]]), torch.tensor([[[1.0, 1.0], [3.0, 1.0]]])]
    children = [torch.tensor([[0, -1]]), torch.tensor([[-1, -1]])]
    values = [torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 3.0]])]
    returns = tree_lambda_returns(rewards, children, values, gamma=1.0, lam=0.5)
    # Turn 2 keeps its rewards; their mean per agent is (2, 1).
    # Turn 1, joint action 0: (1, 0) + 0.5 * V(child) + 0.5 * (2, 1) = (1, 0) + (0.5, 1.5) + (1, 0.5)
    torch.testing.assert_close(returns[1], rewards[1])
    torch.testing.assert_close(returns[0], torch.tensor([[[2.5, 2.0], [0.0, 2.0]]]))
    # The same advantage as GAE's delta form: delta = r + V(child) - V = (1.5, 2.5); the
    # child's mean advantage is mean(G - V) = (1, -2); A = delta + 0.5 * (1, -2) = (2.0, 1.5).
    torch.testing.assert_close(returns[0][0, 0] - values[0][0], torch.tensor([2.0, 1.5]))


def test_lambda_one_is_the_monte_carlo_return_and_zero_the_td_target():
    torch.manual_seed(0)
    rewards = [torch.randn(2, 3, 2), torch.randn(4, 3, 2)]
    children = [torch.tensor([[0, 1, -1], [2, -1, 3]]), torch.full((4, 3), -1)]
    values = [torch.randn(2, 2), torch.randn(4, 2)]
    monte_carlo = tree_lambda_returns(rewards, children, values, gamma=0.7, lam=1.0)
    for ours, expected in zip(monte_carlo, tree_returns(rewards, children, discount=0.7)):
        torch.testing.assert_close(ours, expected)
    td = tree_lambda_returns(rewards, children, values, gamma=0.7, lam=0.0)
    expected = rewards[0].clone()
    for m, j in [(0, 0), (0, 1), (1, 0), (1, 2)]:
        expected[m, j] += 0.7 * values[1][children[0][m, j]]
    torch.testing.assert_close(td[0], expected)


def test_lambda_returns_reject_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match=r"turn 1: rewards \(1, 1, 1\), children \(1, 1\) and values \(1, 2\)"):
        tree_lambda_returns([torch.zeros(1, 1, 1)], [NO_CHILD], [torch.zeros(1, 2)], 1.0, 1.0)
    with pytest.raises(ValueError, match="turn 1 has children but it is the last turn"):
        tree_lambda_returns([torch.zeros(1, 1, 1)], [torch.tensor([[0]])], [torch.zeros(1, 1)], 1.0, 1.0)


def original_whiten(advantages):
    """comlrl 1.4.3's ``_prepare_advantages`` (ac_base.py): population std floored at 1e-6, and
    a lone advantage left as it is."""
    if advantages.numel() < 2:
        return advantages.clone()
    return (advantages - advantages.mean()) / advantages.std(unbiased=False).clamp(min=1e-6)


def test_whiten_divides_by_the_population_std_as_the_original():
    # mean 3, centred (-2, -1, 0, 3), population std sqrt(14 / 4) = 1.8708
    values = torch.tensor([1.0, 2.0, 3.0, 6.0])
    out = whiten(values)
    torch.testing.assert_close(out, torch.tensor([-1.0690, -0.5345, 0.0, 1.6036]), atol=1e-4, rtol=0)
    torch.testing.assert_close(out, original_whiten(values))
    torch.testing.assert_close(whiten(torch.full((3,), 2.0)), torch.zeros(3))  # no spread: the floor, not a NaN


def test_a_single_advantage_is_left_unwhitened_as_in_the_original():
    # 1.4.3 whitened only when there was more than one advantage: a lone r - V kept its value
    # (and its policy gradient); centring it would make it 0.
    assert whiten(torch.tensor([5.0])).tolist() == [5.0] == original_whiten(torch.tensor([5.0])).tolist()


def sum_over(parts):
    """A data-parallel ``reduce`` over processes holding ``parts``."""
    totals = [[p.numel(), p.sum().item(), (p.double() ** 2).sum().item()] for p in parts]
    return lambda _: [sum(column) for column in zip(*totals)]


def test_whitening_over_processes_equals_whitening_everything():
    values = torch.tensor([1.0, 2.0, 3.0, 6.0, -1.0])
    parts = [values[:2], values[2:]]
    whitened = torch.cat([whiten(p, reduce=sum_over(parts)) for p in parts])
    torch.testing.assert_close(whitened, whiten(values))
    torch.testing.assert_close(whitened, original_whiten(values))


def test_one_advantage_over_all_processes_is_left_unwhitened():
    # The count is every process's: one value on one rank and none on the other is a lone value.
    parts = [torch.tensor([4.0]), torch.tensor([])]
    assert whiten(parts[0], reduce=sum_over(parts)).tolist() == [4.0]
    # One value on each of two ranks is two values: whitened together, to -1 and 1.
    parts = [torch.tensor([4.0]), torch.tensor([2.0])]
    assert [whiten(p, reduce=sum_over(parts)).item() for p in parts] == pytest.approx([1.0, -1.0])


def test_clipped_value_loss_by_hand():
    values, old, targets = torch.tensor([1.0, 0.4]), torch.tensor([0.5, 0.5]), torch.tensor([2.0, 0.0])
    losses, clipped = clipped_value_loss(values, old, targets, clip_range=0.2)
    # No factor 1/2 (comlrl 1.4.3's value loss was value_loss_coef * (G - v)^2):
    # 0: (1 - 2)^2 = 1 vs clipped value 0.7: (0.7 - 2)^2 = 1.69, the larger -> 1.69, clipped
    # 1: (0.4 - 0)^2 = 0.16 vs clipped value 0.4 (a move of 0.1 is inside the range) -> 0.16
    torch.testing.assert_close(losses, torch.tensor([1.69, 0.16]))
    assert clipped.tolist() == [True, False]
    plain, none_clipped = clipped_value_loss(values, old, targets, clip_range=None)
    torch.testing.assert_close(plain, torch.tensor([1.0, 0.16]))
    assert not none_clipped.any()


def test_explained_variance():
    targets = torch.tensor([1.0, 2.0, 4.0])
    assert explained_variance(targets, targets).value() == pytest.approx(1.0)
    assert explained_variance(torch.full((3,), targets.mean().item()), targets).value() == pytest.approx(0.0, abs=1e-6)
    assert explained_variance(torch.zeros(2), torch.ones(2)).value() is None  # constant targets: undefined


def test_token_entropy_and_the_entropy_bonus():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    probabilities = logits.softmax(-1)
    expected = -(probabilities * probabilities.log()).sum(-1)
    torch.testing.assert_close(token_entropy(logits), expected)

    logps = torch.randn(2, 3)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    dapo = token_weights(mask.sum(dim=1), "dapo", 3)
    plain = policy_gradient_loss(logps, advantages, mask, dapo)
    bonus = policy_gradient_loss(logps, advantages, mask, dapo, entropy=expected, entropy_coef=0.1)
    mean_entropy = (expected * mask).sum() / mask.sum()  # dapo: every token weighs 1/5
    torch.testing.assert_close(bonus.loss, plain.loss - 0.1 * mean_entropy)
    torch.testing.assert_close(bonus.entropy, mean_entropy)
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the entropy"):
        policy_gradient_loss(logps, advantages, mask, dapo, entropy_coef=0.1)


def test_value_head_starts_at_zero_and_has_a_hidden_layer_when_asked():
    head = ValueHead(8, num_values=3, hidden_dim=4)
    assert len(head.layers) == 3 and head.num_values == 3
    assert torch.equal(head(torch.randn(5, 8)), torch.zeros(5, 3))


def test_a_critic_learns_a_fixed_set_of_returns():
    tok = char_tokenizer()
    backbone = tiny_gpt2(tok, seed=3)
    critic = Critic("critic 0", backbone, ValueHead(hidden_size(backbone)), tok)
    texts = ["a cat", "hello there:", "tell me, why?", "go"]
    targets = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    inputs = critic.encode(texts, describe=str)
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        values = critic.values(inputs, slice(None))
        loss = clipped_value_loss(values, values.detach(), targets, clip_range=None)[0].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx((targets**2).mean().item())  # a new head predicts 0
    assert sum(losses[-10:]) / 10 < 0.1 * losses[0]  # the last losses, averaged over GPT-2's dropout noise


def test_critic_inputs_it_cannot_encode_are_named():
    tok = char_tokenizer()
    critic = Critic("critic 0", tiny_gpt2(tok), ValueHead(32), tok)
    with pytest.raises(ValueError, match=r"critic 0's input for row 1 holds characters its tokenizer cannot encode"):
        critic.encode(["a cat", "[Agent 0]"], describe=lambda k: f"row {k}")
    with pytest.raises(ValueError, match="is 300 tokens long, above the 256 positions of the critic's model"):
        critic.encode(["a" * 300], describe=lambda k: f"row {k}")
