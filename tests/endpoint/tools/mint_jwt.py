#!/usr/bin/env python3
"""Mints a JWT with PyJWT for the endpoint tests: an implementation other than the server's.

    mint_jwt.py ALG KEY_FILE CLAIMS_JSON [HEADERS_JSON]   prints the token
    mint_jwt.py --jwks OUT.json KID=PEM_FILE... [KID=oct:SECRET_FILE] [KID=short:EC_PEM_FILE]
                                                                writes a JWK Set
    mint_jwt.py --ec-key-with-short-x OUT.pem   a P-256 private key whose x has a leading zero byte

`short:` writes an EC key's x without its leading zero bytes, as writers that encode the
coordinates as integers do (PyJWT before 2.7): RFC 7518 wants 32 bytes, verifiers meet both.

KEY_FILE holds a PEM private key (RS256, ES256) or the raw secret (HS256, and the algorithm
confusion case: HS256 with a public key's PEM as the secret). ALG "none" makes an unsigned token.
"""
import base64
import json
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


def jwks(out, specs):
    keys = []
    for spec in specs:
        kid, path = spec.split("=", 1)
        if path.startswith("short:"):
            with open(path[6:], "rb") as f:
                nums = serialization.load_pem_public_key(f.read()).public_numbers()
            b64 = lambda i, n: base64.urlsafe_b64encode(i.to_bytes(n, "big")).rstrip(b"=").decode()
            k = {"kty": "EC", "crv": "P-256", "x": b64(nums.x, (nums.x.bit_length() + 7) // 8),
                 "y": b64(nums.y, 32)}
        elif path.startswith("oct:"):
            with open(path[4:], "rb") as f:
                secret = f.read()
            k = json.loads(jwt.algorithms.HMACAlgorithm.to_jwk(secret))
        else:
            with open(path, "rb") as f:
                pub = serialization.load_pem_public_key(f.read())
            algo = RSAAlgorithm if "RSA" in type(pub).__name__ else ECAlgorithm
            k = json.loads(algo.to_jwk(pub))
        k["kid"] = kid
        keys.append(k)
    with open(out, "w") as f:
        json.dump({"keys": keys}, f)


def main():
    if sys.argv[1] == "--jwks":
        return jwks(sys.argv[2], sys.argv[3:])
    if sys.argv[1] == "--ec-key-with-short-x":
        from cryptography.hazmat.primitives.asymmetric import ec
        while True:  # one key in 256 has it
            key = ec.generate_private_key(ec.SECP256R1())
            if key.public_key().public_numbers().x < 1 << 248:
                break
        with open(sys.argv[2], "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        return None
    alg, key_file, claims = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    if alg == "none":
        token = jwt.encode(claims, None, algorithm="none", headers=headers)
    else:
        with open(key_file, "rb") as f:
            key = f.read()
        if alg == "HS256":
            # PyJWT refuses a PEM as an HMAC secret: sign by hand for the confusion case.
            import base64, hashlib, hmac
            b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
            head = {"alg": "HS256", "typ": "JWT", **(headers or {})}
            signing = b64(json.dumps(head).encode()) + "." + b64(json.dumps(claims).encode())
            sig = hmac.new(key, signing.encode(), hashlib.sha256).digest()
            token = signing + "." + b64(sig)
        else:
            token = jwt.encode(claims, key, algorithm=alg, headers=headers)
    print(token)


if __name__ == "__main__":
    main()
