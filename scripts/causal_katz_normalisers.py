"""Why causal Katz-InfSA normalises each query by its row's L1 norm (docs/spec/infsa.md 4.1): the output's size
against position for the two prefix-only normalisers, dense float64 triangular solves, one seed (about 1 min on
2 CPU cores). Prints ||O_i|| / ||V_i|| at i = 16, 256, 1024, 4096."""

import torch
import torch.nn.functional as F


def main(n: int = 4096, d: int = 64, gamma: float = 0.9) -> None:
    torch.manual_seed(0)
    for name, phi in (("relu", torch.relu), ("elu+1", lambda x: F.elu(x) + 1)):
        q = phi(torch.randn(n, d, dtype=torch.float64) / d**0.5 * 2)
        k = phi(torch.randn(n, d, dtype=torch.float64) / d**0.5 * 2)
        v = torch.randn(n, d, dtype=torch.float64)
        scores = torch.tril(q @ k.T)
        norms = {
            "prefix Frobenius": torch.sqrt(torch.cumsum((scores * scores).sum(1), 0)) + 1e-6,
            "row L1": scores.sum(1) + 1e-6,
        }
        for label, norm in norms.items():
            system = torch.eye(n, dtype=torch.float64) - gamma * scores / norm[:, None]
            out = torch.linalg.solve_triangular(system, v, upper=False) - v
            ratio = out.norm(dim=1) / v.norm(dim=1)
            print(f"{name:6s} {label:17s}", " ".join(f"{ratio[i - 1]:6.1f}" for i in (16, 256, 1024, 4096)))


if __name__ == "__main__":
    main()
