"""The Hugging Face Space's app file: the page `ckpt-repair serve` serves (repair/web/app.py), with
Hugging Face OAuth sign-in (the Space sets SYSTEM=spaces, SPACE_ID and the OAUTH_* variables)."""

from repair.web.app import main

if __name__ == "__main__":
    main()
