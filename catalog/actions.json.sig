{
  "schema": "sensorium-catalog-signature.v1",
  "alg": "ed25519",
  "key/id": "26d160dae106b7bb",
  "signature": "6iSjeSXJr3SP8n6g0j6MChWAcrwFevFOMvqQN87Ihf2e8n8i-4fZyXDrTsSJoGb16nGi9YYLqrZCMALdq6fVAw"
}
