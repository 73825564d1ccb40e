{
  "schema": "sensorium-catalog-signature.v1",
  "alg": "ed25519",
  "key/id": "26d160dae106b7bb",
  "signature": "7zvdF8_ckmjrfQwbAGBawOeHKGi52d5_JP4KQEeWzIKNWOwJLvS2x8AKRssMinq8Ckudfe6PkIPiCNfxpL97BA"
}
