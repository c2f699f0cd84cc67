"""The four guides the likelihood and prior tests fit, by name."""

import pyro_dropout as pd

GUIDES = {
    "dropout": lambda m: pd.AutoDropout(m, dropout_rate=0.05, input_dropout_rate=0.05),
    "concrete": lambda m: pd.AutoConcreteDropout(m),
    "meanfield": lambda m: pd.AutoMeanField(m),
    "vd": lambda m: pd.AutoVariationalDropout(m),
}
